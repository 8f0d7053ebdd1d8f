"""`kgreasoner eval`: run methods on a dataset split and write per-question JSONL plus a summary.

    kgreasoner eval --methods oracle,tog,sog --dataset PQ-2H --split test \
        --llm openai:http://127.0.0.1:8000/v1#my-model --out runs/pq2h

`--dataset pathquestion` evaluates the four PathQuestion sets, each into `OUT/<set>/` on its
own KB. Without `--kg`, the dataset's own KB is loaded in memory.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kgreasoner.config import add_config_arguments, describe, load_config
from kgreasoner.llm.spec import CLIENT_FORMS, describe_forms


def register(subparsers: argparse._SubParsersAction) -> None:
    from kgreasoner.evaluation.methods import METHODS, EvalConfig
    from kgreasoner.records.splits import add_split_scheme_argument

    parser = subparsers.add_parser(
        "eval",
        help="evaluate methods (kgreasoner, tog, sog, parog, io, cot, oracle) on a dataset split",
        description=__doc__ + "\nFields of the --config YAML (EvalConfig; nested sections tog, sog, parog, "
        "oracle, tool, rollout):\n" + describe(EvalConfig),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--methods", required=True, help=f"comma-separated, from: {', '.join(METHODS)}")
    parser.add_argument("--dataset", required=True, help="dataset name or path (see kgreasoner.data.load_dataset)")
    parser.add_argument("--split", default="test", choices=("train", "dev", "test"), help="split to evaluate")
    add_split_scheme_argument(parser)
    parser.add_argument("--seed", type=int, default=0, help="seed of the split scheme")
    parser.add_argument("--llm", default=None, help=f"{describe_forms(CLIENT_FORMS)} (not needed by oracle)")
    parser.add_argument(
        "--kg", default=None, help="KG spec (kgreasoner.kg.open_kg); default: the dataset's KB in memory"
    )
    parser.add_argument("--out", required=True, type=Path, help="output folder (resumes what is already there)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N questions of the split")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_config_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kgreasoner.data import load_datasets, open_dataset_kg
    from kgreasoner.data.entity_names import with_kg_names
    from kgreasoner.data.path_search import with_derived_paths
    from kgreasoner.evaluation.harness import run_evaluation, select_examples
    from kgreasoner.evaluation.methods import EvalConfig, MethodContext
    from kgreasoner.evaluation.report import RunInfo, render_markdown
    from kgreasoner.kg.open import open_kg
    from kgreasoner.llm import open_llm

    config = load_config(EvalConfig, args.config, args.overrides)
    if args.limit is not None:
        config.limit = args.limit
    names = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not names:
        raise ValueError("--methods names no method")
    datasets = load_datasets(args.dataset, split=args.split, split_scheme=args.split_scheme, seed=args.seed)
    if len(datasets) > 1 and args.kg:
        raise ValueError(f"--dataset {args.dataset} holds {len(datasets)} sets with their own KBs; drop --kg")
    llm = open_llm(args.llm, config.max_tokens, config.batch_size, config.workers or 8) if args.llm else None
    try:
        for dataset in datasets:
            kg = open_kg(args.kg) if args.kg else open_dataset_kg(dataset)
            # RoG's questions come without gold paths: the oracle walks the ones derived on each
            # question's own subgraph. CWQ's topic entities, named by their mids only, get the KG's names.
            examples = [with_derived_paths(e, kg) for e in select_examples(dataset.examples, config.limit)]
            examples = with_kg_names(examples, kg)
            out = args.out / dataset.name if len(datasets) > 1 else args.out
            info = RunInfo(
                dataset.name,
                args.split,
                dataset.split_scheme,
                dataset.seed,
                kg=args.kg or dataset.kg_spec or str(dataset.kb_path),
                llm=args.llm or "",
            )
            print(f"{dataset.name}: {len(examples)} {args.split} questions ({info.describe_split()}) -> {out}")
            summaries = run_evaluation(
                names, examples, MethodContext(kg, llm, config), out, info, progress=not args.no_progress
            )
            print(render_markdown(info, summaries))
            kg.close()
    finally:
        if llm is not None:
            llm.close()
    return 0
