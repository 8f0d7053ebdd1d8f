"""SFT warm-up: `torchrun --nproc_per_node N train/sft.py --config configs/<model>/sft.yaml`."""

import argparse
import sys

from kgreasoner.config import add_config_arguments, load_config
from kgreasoner.training.common import finish_distributed, report, show_progress
from kgreasoner.training.preflight import add_arguments as add_preflight_arguments
from kgreasoner.training.preflight import run_preflight
from kgreasoner.training.sft import SFTRecipe, train_sft


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_config_arguments(parser)
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint in output_dir")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="only check the recipe (TRL config, data, model, memory per GPU) as `kgreasoner preflight`",
    )
    add_preflight_arguments(parser)
    args = parser.parse_args()
    if args.dry_run:
        sys.exit(run_preflight(args.config, args.overrides, args))
    recipe = load_config(SFTRecipe, args.config, args.overrides)
    show_progress()
    report(f"final model: {train_sft(recipe, resume=args.resume)}")
    finish_distributed()


if __name__ == "__main__":
    main()
