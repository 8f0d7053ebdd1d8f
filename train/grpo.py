"""GRPO with the KG search tool in the loop:
`torchrun --nproc_per_node N train/grpo.py --config configs/<model>/grpo.yaml [--resume]`."""

import argparse
import sys

from kgreasoner.config import add_config_arguments, load_config
from kgreasoner.training.common import finish_distributed, report, show_progress
from kgreasoner.training.grpo import GRPORecipe, train_grpo
from kgreasoner.training.preflight import add_arguments as add_preflight_arguments
from kgreasoner.training.preflight import run_preflight


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_config_arguments(parser)
    parser.add_argument(
        "--resume", action="store_true", help="continue the first unfinished episode from its last checkpoint"
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="only check the recipe (TRL config, data, model, memory per GPU) as `kgreasoner preflight`",
    )
    add_preflight_arguments(parser)
    args = parser.parse_args()
    if args.dry_run:
        sys.exit(run_preflight(args.config, args.overrides, args))
    recipe = load_config(GRPORecipe, args.config, args.overrides)
    show_progress()
    report(f"final model: {train_grpo(recipe, resume=args.resume)}")
    finish_distributed()


if __name__ == "__main__":
    main()
