"""One entry point for every dataset: `load_dataset(name_or_path)`, and the KG it runs on.

`name_or_path` may be:
- a PathQuestion set, any case: `PQ-2H`, `pq-3h`, `PQL-2H`, `PQL-3H`, `PQL-3H_more`;
- `pathquestion`: the four published sets (PQ-2H, PQ-3H, PQL-2H, PQL-3H), each with its own KB,
  so only `load_datasets` takes it and returns one Dataset per set;
- a ToG benchmark name (`cwq`, `webqsp`, `grailqa`, `simpleqa`): its file in the data folder `tog/`
  (test questions only);
- `webqsp-official` / `cwq-official`: the official releases' files (`WebQSP.train.json`, ...,
  `ComplexWebQuestions_dev.json`, ...) in the data folder of that name, with their training splits;
  their KG is Freebase (a SPARQL endpoint);
- `rog-webqsp` / `rog-cwq`: RoG's per-question subgraph files (parquet or JSONL) in the data folder
  of that name; their KG is those subgraphs (`subgraph:FOLDER`), so no Freebase server is needed;
- a dataset folder (`kb.tsv` or `kb.nt`, optional `names.tsv`, `questions.jsonl`);
- a JSONL file in our schema or with RoG's records, a RoG `.parquet` file, or a `.json` file of
  ToG's or of the official WebQSP / CWQ releases (told apart by their shape).

Examples without a split get a seeded 80/10/10 one (`scheme` grouped, the default, or random);
examples that have one keep it, and the Dataset says `split_scheme="given"`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kgreasoner.records.pathquestion import PATHQUESTION_SETS, load_pathquestion, pathquestion_set_name
from kgreasoner.records.paths import find_data_dir
from kgreasoner.records.schema import QAExample, SchemaError, read_jsonl
from kgreasoner.records.splits import DEFAULT_SPLIT_SCHEME, SCHEMES, SPLIT_NAMES, assign_splits
from kgreasoner.records.tog_json import TOG_FILES, TOG_FORMATS, load_tog_json
from kgreasoner.records.webqsp_cwq import is_cwq_release, is_webqsp_release, load_cwq, load_webqsp, read_json

if TYPE_CHECKING:
    from kgreasoner.kg.base import KnowledgeGraph

GROUPS: dict[str, tuple[str, ...]] = {"pathquestion": PATHQUESTION_SETS}
KB_FILES = ("kb.tsv", "kb.nt")
# Named sets read from the data folder of the same name: name -> (source written on the Dataset,
# the file names it holds, lower-cased). RoG's are every .parquet / .jsonl file in the folder.
RELEASES: dict[str, tuple[str, tuple[str, ...]]] = {
    "webqsp-official": ("WebQSP", ("webqsp.train.json", "webqsp.test.json")),
    "cwq-official": (
        "CWQ",
        ("complexwebquestions_train.json", "complexwebquestions_dev.json", "complexwebquestions_test.json"),
    ),
}
ROG_SETS: dict[str, str] = {"rog-webqsp": "RoG-WebQSP", "rog-cwq": "RoG-CWQ"}


@dataclass
class Dataset:
    """Questions plus where their KG lives.

    Attributes:
        name: the set's name (`PQ-2H`, `CWQ`, a folder or file stem).
        examples: every example, with `split` set (all of them, whatever `split` was asked for,
            unless `load_dataset(split=...)` filtered them).
        kb_path: the triples file, or None when the KG is external (Freebase for ToG benchmarks).
        names_path: an `id \\t label` file for the KB, when there is one.
        kg_spec: the KG (an `open_kg` spec) when it is not a KB file: `subgraph:PATH` for RoG's
            per-question subgraphs.
        split_scheme: `random` / `grouped` when this loader made the split, `given` when the data had it.
        seed: the split's seed (None for `given`).
        questions_path: the JSONL file the examples were read from, when they were (errors name its lines).
    """

    name: str
    examples: list[QAExample]
    kb_path: Path | None
    names_path: Path | None = None
    kg_spec: str | None = None
    split_scheme: str = "given"
    seed: int | None = None
    questions_path: Path | None = None

    def split(self, name: str) -> list[QAExample]:
        """The examples of one split (`train`, `dev` or `test`)."""
        if name not in SPLIT_NAMES:
            raise ValueError(f"split must be one of {SPLIT_NAMES}, got {name!r}")
        return [e for e in self.examples if e.split == name]

    def __len__(self) -> int:
        return len(self.examples)

    def __iter__(self) -> Iterator[QAExample]:
        return iter(self.examples)


def load_dataset(
    name_or_path: str | Path,
    split: str | None = None,
    split_scheme: str = DEFAULT_SPLIT_SCHEME,
    seed: int = 0,
    root: str | Path | None = None,
) -> Dataset:
    """Load one dataset (see the module docstring for what `name_or_path` may be).

    `split` keeps only that split's examples; `root` is the data root (or the benchmark's own
    folder) for named benchmarks, instead of the default lookup of `find_data_dir`.
    """
    if split_scheme not in SCHEMES:
        raise ValueError(f"split_scheme must be one of {SCHEMES}, got {split_scheme!r}")
    if split is not None and split not in SPLIT_NAMES:
        raise ValueError(f"split must be one of {SPLIT_NAMES}, got {split!r}")
    key = str(name_or_path).strip().lower()
    if key in GROUPS:
        raise ValueError(
            f"{name_or_path!r} holds {len(GROUPS[key])} sets with their own KBs ({', '.join(GROUPS[key])}): "
            "use load_datasets() for all of them, or name one set"
        )
    dataset = _load_unsplit(name_or_path, root, split)
    dataset = _with_splits(dataset, split_scheme, seed)
    if split is not None:
        dataset.examples = dataset.split(split)
    return dataset


def load_datasets(
    name_or_path: str | Path,
    split: str | None = None,
    split_scheme: str = DEFAULT_SPLIT_SCHEME,
    seed: int = 0,
    root: str | Path | None = None,
) -> list[Dataset]:
    """Every set a name stands for (`pathquestion` -> four Datasets), or a one-element list.

    Each set is split on its own, so its examples keep their own source, KB and split.
    """
    names = GROUPS.get(str(name_or_path).strip().lower(), (name_or_path,))
    return [load_dataset(name, split=split, split_scheme=split_scheme, seed=seed, root=root) for name in names]


def open_dataset_kg(dataset: Dataset) -> KnowledgeGraph:
    """The dataset's KB in the embedded in-memory store, or the KG its `kg_spec` names."""
    # Imported here: kgreasoner.kg.memory imports kgreasoner.data (normalize) at module level.
    from kgreasoner.kg.memory import MemoryKG
    from kgreasoner.kg.open import open_kg

    if dataset.kg_spec is not None:
        return open_kg(dataset.kg_spec)
    if dataset.kb_path is None:
        raise ValueError(
            f"dataset {dataset.name!r} has no KB file (its KG is external, e.g. Freebase over SPARQL); "
            "open it with the sparql backend"
        )
    return MemoryKG.from_file(dataset.kb_path, names=dataset.names_path)


def _load_unsplit(name_or_path: str | Path, root: str | Path | None, split: str | None) -> Dataset:
    """The dataset as its files give it; RoG's files of a split other than `split` are not read."""
    text = str(name_or_path)
    pq_name = pathquestion_set_name(text)
    if pq_name is not None:
        examples, kb_path = load_pathquestion(pq_name, root)
        return Dataset(name=pq_name, examples=examples, kb_path=kb_path)
    if text.strip().lower() in TOG_FORMATS:
        return _load_tog_benchmark(text.strip().lower(), root)
    if text.strip().lower() in RELEASES:
        return _load_release(text.strip().lower(), root)
    if text.strip().lower() in ROG_SETS:
        folder = find_data_dir(text.strip().lower(), root)
        return _rog_dataset(ROG_SETS[text.strip().lower()], folder, split)
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "questions.jsonl").is_file() and _holds_rog_files(path):
            return _rog_dataset(path.resolve().name, path, split)
        return _load_folder(path)
    if path.is_file():
        if path.suffix == ".parquet" or (path.suffix == ".jsonl" and _first_jsonl_is_rog(path)):
            return _rog_dataset(path.stem, path, split)
        if path.suffix == ".jsonl":
            return Dataset(name=path.stem, examples=read_jsonl(path), kb_path=None, questions_path=path)
        if path.suffix == ".json":
            return Dataset(name=path.stem, examples=_load_json_file(path), kb_path=None)
        raise ValueError(
            f"{path}: unsupported file type; expected .jsonl (our schema or RoG's), "
            ".parquet (RoG) or .json (ToG, official WebQSP or CWQ)"
        )
    known = [*PATHQUESTION_SETS, "PQL-3H_more", *GROUPS, *TOG_FORMATS, *RELEASES, *ROG_SETS]
    raise FileNotFoundError(f"{name_or_path!r} is neither a known dataset ({', '.join(known)}) nor an existing path")


def _load_folder(folder: Path) -> Dataset:
    questions = folder / "questions.jsonl"
    if not questions.is_file():
        raise FileNotFoundError(f"{folder}: a dataset folder needs questions.jsonl (and kb.tsv)")
    kb_path = next((folder / f for f in KB_FILES if (folder / f).is_file()), None)
    if kb_path is None:
        raise FileNotFoundError(f"{folder}: a dataset folder needs a KB file ({' or '.join(KB_FILES)})")
    names = folder / "names.tsv"
    return Dataset(
        name=folder.resolve().name,
        examples=read_jsonl(questions),
        kb_path=kb_path,
        names_path=names if names.is_file() else None,
        questions_path=questions,
    )


def _load_tog_benchmark(fmt: str, root: str | Path | None) -> Dataset:
    folder = find_data_dir("tog", root)
    candidates = [name for name, f in TOG_FILES.items() if f == fmt]
    by_lower = {p.name.lower(): p for p in folder.iterdir() if p.is_file()}
    for candidate in candidates:
        if candidate in by_lower:
            return Dataset(name=TOG_FORMATS[fmt], examples=load_tog_json(by_lower[candidate], fmt), kb_path=None)
    raise FileNotFoundError(f"{folder}: no file for {fmt} (looked for {', '.join(candidates)}, any case)")


def _load_release(name: str, root: str | Path | None) -> Dataset:
    """An official release's files in its data folder: each one that is there, in release order."""
    folder = find_data_dir(name, root)
    source, files = RELEASES[name]
    by_lower = {p.name.lower(): p for p in folder.iterdir() if p.is_file()}
    present = [by_lower[f] for f in files if f in by_lower]
    if not present:
        raise FileNotFoundError(f"{folder}: no file of {source} (looked for {', '.join(files)}, any case)")
    examples = [e for path in present for e in _load_json_file(path)]
    return Dataset(name=source, examples=examples, kb_path=None)


def _load_json_file(path: Path) -> list[QAExample]:
    """A `.json` file of the official WebQSP or CWQ release (split from its name), else ToG's."""
    data = read_json(path)
    if is_webqsp_release(data):
        return load_webqsp(path, data=data)
    if is_cwq_release(data):
        return load_cwq(path, data=data)
    return load_tog_json(path)


def _rog_dataset(name: str, path: Path, split: str | None) -> Dataset:
    """RoG's records at `path` (a file or folder), searched on their own subgraphs; `split`: those
    files only (see `load_rog`)."""
    # Imported here: pyarrow takes 0.4 s to import, and only RoG's files need it.
    from kgreasoner.records.rog import load_rog

    return Dataset(name=name, examples=load_rog(path, split), kb_path=None, kg_spec=f"subgraph:{path.resolve()}")


def _holds_rog_files(folder: Path) -> bool:
    """True for a folder with RoG's record files under it (a clone of the published dataset)."""
    return any(
        p.is_file() and (p.suffix == ".parquet" or (p.suffix == ".jsonl" and _first_jsonl_is_rog(p)))
        for p in folder.rglob("*")
    )


def _first_jsonl_is_rog(path: Path) -> bool:
    """True when the first record of a JSONL file has RoG's fields (our schema's has none of them)."""
    from kgreasoner.records.rog import is_rog_record

    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                try:
                    return is_rog_record(json.loads(line))
                except json.JSONDecodeError:
                    return False  # the schema reader reports the line
    return False


def _with_splits(dataset: Dataset, scheme: str, seed: int) -> Dataset:
    """Split examples that have none; keep a given split; refuse a partly split dataset."""
    missing = sum(1 for e in dataset.examples if not e.split)
    if missing == 0:
        dataset.split_scheme, dataset.seed = "given", None
    elif missing == len(dataset.examples):
        dataset.examples = assign_splits(dataset.examples, scheme, seed)
        dataset.split_scheme, dataset.seed = scheme, seed
    else:
        first = next(e.id for e in dataset.examples if not e.split)
        raise SchemaError(
            f"dataset {dataset.name!r}: {missing} of {len(dataset.examples)} examples have no split "
            f"(first: {first}); give every example a split or none"
        )
    return dataset
