"""Train the GAT ranker, or evaluate a saved one against the baselines.

python train/ranker.py --config configs/ranker.yaml
python train/ranker.py --config configs/ranker.yaml --eval checkpoints/ranker --set data=PQL-3H
"""

import argparse
import logging

from kgreasoner.config import add_config_arguments, load_config
from kgreasoner.retrieval.training import RankerTrainConfig, evaluate_saved, format_table, train_ranker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser)
    parser.add_argument(
        "--eval", metavar="RANKER_DIR", help="only evaluate this saved ranker (gat vs embedding vs none)"
    )
    parser.add_argument("--split", default="test", choices=("train", "dev", "test"), help="split --eval measures")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    config = load_config(RankerTrainConfig, args.config, args.overrides)
    if args.eval:
        where, results = evaluate_saved(config, args.eval, args.split)
        print(format_table(results, config.eval_ks, f"{where}: ranker {args.eval}"))
        return
    result = train_ranker(config)
    print(
        f"saved {result.out_dir} (best epoch {result.best_epoch} of {result.epochs_run}, "
        f"{result.train_seconds:.1f}s training)"
    )
    print(format_table(result.dev, config.eval_ks, f"{result.description}, dev"))
    if result.test:
        print(format_table(result.test, config.eval_ks, f"{result.description}, test"))


if __name__ == "__main__":
    main()
