"""A synthetic Freebase-like KG with 1-, 2- and 3-hop questions: the embedded default dataset.

The command line (`python -m data_gen.synthetic`): generate a world, write it as a dataset folder,
print its sizes.
"""

from __future__ import annotations

import argparse
import time

from data_gen.synthetic.dataset import DEFAULT_MULTI_TOPIC_SHARE, DEFAULT_QUESTIONS, generate, write_data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m data_gen.synthetic", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="dataset folder to write (kb.tsv, names.tsv, questions.jsonl)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the world and the questions")
    parser.add_argument("--target-triples", type=int, default=None, help="grow the KG to at least this many triples")
    parser.add_argument("--num-entities", type=int, default=None, help="about this many named entities")
    parser.add_argument("--questions", type=int, default=DEFAULT_QUESTIONS, help="number of questions")
    parser.add_argument(
        "--multi-topic-share",
        type=float,
        default=DEFAULT_MULTI_TOPIC_SHARE,
        help="share of multi-topic questions (answers: the intersection of two topics' paths)",
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        data = generate(
            args.seed,
            num_entities=args.num_entities,
            target_triples=args.target_triples,
            num_questions=args.questions,
            multi_topic_share=args.multi_topic_share,
        )
    except ValueError as err:
        parser.error(str(err))
    generated = time.perf_counter()
    write_data(data, args.out)
    written = time.perf_counter()
    print(f"wrote {args.out}: generated in {generated - started:.1f}s, written in {written - generated:.1f}s")
    for key, value in data.stats().items():
        print(f"  {key}: {value}")
    return 0
