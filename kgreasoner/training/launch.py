"""The command line of `train/sft.py` and `train/grpo.py`: one recipe, trained, or checked with `--dry-run`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from kgreasoner.config import ConfigError, add_config_arguments, load_config
from kgreasoner.training.common import finish_distributed, report, show_progress
from kgreasoner.training.preflight import add_arguments as add_preflight_arguments
from kgreasoner.training.preflight import run_preflight

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

Recipe = TypeVar("Recipe", bound="DataclassInstance")


def train_main(
    description: str,
    recipe_class: type[Recipe],
    train: Callable[..., Path],
    resume_help: str,
    argv: list[str] | None = None,
) -> None:
    """`train/sft.py` and `train/grpo.py`: `--config`/`--set`, `--resume`, and `--dry-run` (`kgreasoner preflight`)."""
    parser = argparse.ArgumentParser(description=description)
    add_config_arguments(parser)
    parser.add_argument("--resume", action="store_true", help=resume_help)
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="only check the recipe (TRL config, data, model, memory per GPU) as `kgreasoner preflight`",
    )
    add_preflight_arguments(parser)
    args = parser.parse_args(argv)
    if args.dry_run:
        sys.exit(run_preflight(args.config, args.overrides, args))
    try:
        recipe = load_config(recipe_class, args.config, args.overrides)
    except ConfigError as err:  # a recipe mistake is a message, not a traceback
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    show_progress()
    report(f"final model: {train(recipe, resume=args.resume)}")
    finish_distributed()
