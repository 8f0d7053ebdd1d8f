"""`kgreasoner prepare-data SOURCE --out DIR`: any dataset as a self-contained dataset folder.

The folder (`kb.tsv` or `kb.nt`, `names.tsv` when the source has one, `questions.jsonl`,
`prepare.json`) has every question's split fixed and gold paths filled in, so every later stage
(ranker, warm-up, GRPO, eval) reads the same questions with `split_scheme: given`. SOURCE is
what `kgreasoner.data.load_dataset` takes: a PathQuestion set (`PQ-2H`, also written
`pathquestion:PQ-2H`) or a dataset folder. Questions without gold paths get candidates from
`kgreasoner.data.path_search` (the shortest relation paths from the topic entity to an answer);
where the split was made here (the source had none), it is made after that, so `grouped` groups
by the derived paths. `prepare.json` records the source, the split, the path counts and the
warnings of `kgreasoner.data.question_checks` (answers that are not nodes of the KB: errors with
`--strict`); questions that cannot work (a topic entity not in the KB, intersect walks that never
meet) are refused.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from kgreasoner.data.datasets import KB_FILES, Dataset, load_dataset
from kgreasoner.data.path_search import PathSearch, add_gold_paths
from kgreasoner.data.question_checks import check_questions
from kgreasoner.kg.memory import MemoryKG
from kgreasoner.records.ids import INVERSE_PREFIX
from kgreasoner.records.pathquestion import PATHQUESTION_SETS
from kgreasoner.records.schema import write_jsonl
from kgreasoner.records.splits import DEFAULT_SPLIT_SCHEME, SCHEMES, add_split_scheme_argument, assign_splits
from kgreasoner.terminal import printable

PATHQUESTION_PREFIX = "pathquestion:"
DEFAULT_SEARCH = PathSearch()
SUMMARY_FILE = "prepare.json"


def source_name(source: str) -> str:
    """`pathquestion:PQ-3H` -> `PQ-3H`; `pathquestion` alone -> its first set, PQ-2H; others unchanged."""
    text = source.strip()
    if text.lower() == PATHQUESTION_PREFIX.rstrip(":"):
        return PATHQUESTION_SETS[0]
    if text.lower().startswith(PATHQUESTION_PREFIX):
        name = text[len(PATHQUESTION_PREFIX) :]
        if name.lower() not in {s.lower() for s in (*PATHQUESTION_SETS, "PQL-3H_more")}:
            raise ValueError(
                f"{source!r}: unknown PathQuestion set {name!r}; one of {', '.join(PATHQUESTION_SETS)}, PQL-3H_more"
            )
        return name
    return text


def prepare_dataset(
    source: str,
    out_dir: str | Path,
    split_scheme: str = DEFAULT_SPLIT_SCHEME,
    seed: int = 0,
    root: str | Path | None = None,
    search: PathSearch = DEFAULT_SEARCH,
    strict: bool = False,
) -> dict[str, Any]:
    """Write the dataset folder (see the module docstring); returns the summary written to prepare.json.

    `strict` turns the warnings of `check_questions` into errors."""
    if split_scheme not in SCHEMES:
        raise ValueError(f"split_scheme must be one of {SCHEMES}, got {split_scheme!r}")
    name = source_name(source)
    dataset = load_dataset(name, split_scheme=split_scheme, seed=seed, root=root)
    if dataset.kb_path is None:
        raise ValueError(
            f"{source!r} has no KB file: the data stage needs a dataset folder with kb.tsv "
            "(or kb.nt) or a PathQuestion set"
        )
    out = Path(out_dir)
    if (out / dataset.kb_path.name).exists() and (out / dataset.kb_path.name).samefile(dataset.kb_path):
        raise ValueError(f"--out {out} is the source dataset's own folder; write the prepared dataset to another one")
    kg = MemoryKG.from_file(dataset.kb_path, names=dataset.names_path)
    _check_gold_relations(dataset, set(kg.relation_types))
    warnings = check_questions(dataset, kg, strict)
    examples, paths = add_gold_paths(dataset.examples, kg, search)
    kg.close()
    split_scheme, split_seed = dataset.split_scheme, dataset.seed
    if paths.derived and split_scheme != "given":
        examples = assign_splits([e.with_split("") for e in examples], split_scheme, seed)
    out.mkdir(parents=True, exist_ok=True)
    kb_name = "kb.nt" if dataset.kb_path.suffix == ".nt" else "kb.tsv"
    # Files an earlier run wrote from another source would be read with this one's: remove them.
    stale = [name for name in KB_FILES if name != kb_name] + ([] if dataset.names_path is not None else ["names.tsv"])
    for name in stale:
        (out / name).unlink(missing_ok=True)
    shutil.copyfile(dataset.kb_path, out / kb_name)
    if dataset.names_path is not None:
        shutil.copyfile(dataset.names_path, out / "names.tsv")
    write_jsonl(examples, out / "questions.jsonl")
    summary = {
        "source": source,
        "dataset": dataset.name,
        "kb": str(dataset.kb_path),
        "split_scheme": split_scheme,
        "split_seed": split_seed,
        "splits": dict(sorted(Counter(e.split for e in examples).items())),
        "hops": {str(k): v for k, v in sorted(Counter(e.hops for e in examples).items())},
        "gold_paths": paths.as_dict(),
        "warnings": warnings.as_dict(),
    }
    for message in warnings.first.values():
        print(
            f"prepare-data: warning: {printable(message)} "
            f"(and any others counted in {SUMMARY_FILE}; --strict refuses them)",
            file=sys.stderr,
        )
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


def _check_gold_relations(dataset: Dataset, relations: set[str]) -> None:
    """A gold path must walk relations of the KB: one that does not would train and score a path no search
    can follow."""
    for example in dataset.examples:
        for path in example.gold_paths:
            for relation in path:
                if relation.removeprefix(INVERSE_PREFIX) not in relations:
                    raise ValueError(
                        f"dataset {dataset.name!r}: example {example.id}: gold path {list(path)} uses "
                        f"relation {relation!r}, which {dataset.kb_path} does not have"
                    )


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "prepare-data",
        help="write a dataset as a folder with fixed splits and gold paths (derived where missing)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("source", help="PathQuestion set (PQ-2H or pathquestion:PQ-2H) or dataset folder")
    parser.add_argument("--out", required=True, type=Path, help="dataset folder to write")
    add_split_scheme_argument(parser)
    parser.add_argument("--seed", type=int, default=0, help="seed of that split")
    parser.add_argument(
        "--data-root", default=None, help="data root for named benchmarks (default: $KGREASONER_DATA, ../shared/data)"
    )
    parser.add_argument(
        "--max-hops",
        type=int,
        default=PathSearch.max_hops,
        help="longest path searched for questions without gold paths",
    )
    parser.add_argument(
        "--max-paths", type=int, default=PathSearch.max_paths, help="candidate paths kept per question"
    )
    parser.add_argument(
        "--max-branch", type=int, default=PathSearch.max_branch, help="a path reaching more nodes is not extended"
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="refuse what is only counted as a warning (an answer that is not a node of the KB)",
    )
    parser.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    summary = prepare_dataset(
        args.source,
        args.out,
        args.split_scheme,
        args.seed,
        args.data_root,
        PathSearch(max_hops=args.max_hops, max_paths=args.max_paths, max_branch=args.max_branch),
        args.strict,
    )
    print(json.dumps(summary, indent=2))
    print(f"wrote {args.out}")
    return 0
