"""The `kgreasoner` command. Each area registers its own subcommands from its own module."""

from __future__ import annotations

import argparse
import importlib
import sys

# module path -> it defines `register(subparsers)`; each subcommand sets `func(args) -> int`.
COMMAND_MODULES = (
    "kgreasoner.kg.commands",
    "kgreasoner.data.prepare",
    "data_gen.warmup",
    "data_gen.pipeline_sft",
    "kgreasoner.models",
    "kgreasoner.training.hard_cases",
    "kgreasoner.training.preflight",
    "kgreasoner.training.plots",
    "kgreasoner.evaluation.commands",
    "kgreasoner.serving.commands",
    "kgreasoner.demo",
    "kgreasoner.ablate",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kgreasoner",
        description="Teach a reasoning LLM to search a knowledge graph inside its thinking.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        importlib.import_module(module).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (FileNotFoundError, ValueError) as err:
        print(f"kgreasoner {args.command}: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
