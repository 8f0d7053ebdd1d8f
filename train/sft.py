"""SFT warm-up: `torchrun --nproc_per_node N train/sft.py --config configs/<model>/sft.yaml`."""

import argparse

from kgreasoner.config import add_config_arguments, load_config
from kgreasoner.training.common import finish_distributed
from kgreasoner.training.sft import SFTRecipe, train_sft


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_config_arguments(parser)
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint in output_dir")
    args = parser.parse_args()
    recipe = load_config(SFTRecipe, args.config, args.overrides)
    print(f"final model: {train_sft(recipe, resume=args.resume)}")
    finish_distributed()


if __name__ == "__main__":
    main()
