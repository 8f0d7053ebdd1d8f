"""`kgreasoner demo`: the main job on the embedded default, on one CPU machine.

Until the training stages land, the demo builds the synthetic KG, loads it into the embedded
store and answers a few test questions with the *oracle* path-follower (it walks each
question's gold relation path on the KG): a check that data, KG and scoring agree, not a model.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from kgreasoner.data.normalize import normalize_answer
from kgreasoner.data.schema import read_jsonl
from kgreasoner.kg.base import execute_path
from kgreasoner.kg.memory import MemoryKG


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("demo", help="run the main job on the embedded default (synthetic KG)")
    parser.add_argument("--out", default="outputs/demo", help="folder for the dataset and the report")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic KG and questions")
    parser.add_argument("--questions", type=int, default=5, help="how many test questions to answer")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from data_gen.synthetic import write_synthetic

    out = Path(args.out)
    data_dir = out / "data"
    started = time.perf_counter()
    if (data_dir / "kb.tsv").exists() and (data_dir / "questions.jsonl").exists():
        print(f"[1/3] synthetic dataset: exists in {data_dir}, skipped")
    else:
        print(f"[1/3] synthetic dataset: generating (seed {args.seed}) into {data_dir}")
        write_synthetic(data_dir, seed=args.seed)
    t0 = time.perf_counter()
    kg = MemoryKG.from_file(data_dir / "kb.tsv")
    print(
        f"[2/3] embedded KG: {kg.num_triples:,} triples, {len(kg.entities):,} nodes, "
        f"{len(kg.relation_types)} relation types, loaded in {time.perf_counter() - t0:.2f}s"
    )
    examples = [e for e in read_jsonl(data_dir / "questions.jsonl") if e.split == "test"][: args.questions]
    print(f"[3/3] answering {len(examples)} test questions with the ORACLE path-follower "
          "(walks the gold path; no model is trained yet)")
    correct = 0
    for example in examples:
        topic = example.topic_entities[0]
        reached = execute_path(kg, topic.id, example.gold_paths[0]) if example.gold_paths else set()
        reached.discard(topic.id)  # a path through a marriage leads back to the topic: never its own answer
        predicted = sorted(kg.label(x) for x in reached)
        gold = {normalize_answer(f) for a in example.answers for f in a.surface_forms()}
        hit = bool(predicted) and normalize_answer(predicted[0]) in gold
        correct += hit
        print(f"  Q: {example.question}\n     path: {' -> '.join(example.gold_paths[0]) if example.gold_paths else '-'}"
              f"\n     answer: {' | '.join(predicted[:3]) or '(none)'}  [{'correct' if hit else 'wrong'}]")
    print(f"oracle Hits@1 {correct}/{len(examples)}; total {time.perf_counter() - started:.1f}s")
    return 0
