"""The command line: `python -m data_gen.warmup` and `kgreasoner warmup`."""

from __future__ import annotations

import argparse
import json

from data_gen.warmup.config import WarmupConfig
from data_gen.warmup.records import run
from kgreasoner.config import add_config_arguments, config_command_main, describe, load_config


def register(subparsers: argparse._SubParsersAction) -> None:
    """The `warmup` subcommand of `kgreasoner`."""
    parser = subparsers.add_parser(
        "warmup", help=_HELP, description=_description(), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_config_arguments(parser)
    parser.set_defaults(func=run_command)


_HELP = "generate warm-up SFT trajectories (with error correction) by running the search tool along gold paths"


def _description() -> str:
    return f"{_HELP}.\n\nFields of the --config YAML (WarmupConfig):\n{describe(WarmupConfig)}"


def run_command(args: argparse.Namespace) -> int:
    config = load_config(WarmupConfig, args.config, args.overrides)
    summary = run(config)
    print(
        json.dumps(
            {k: summary[k] for k in ("dataset_name", "records", "by_kind", "by_hops", "by_split", "skipped")}, indent=2
        )
    )
    print(f"wrote {summary['output']} and {config.summary_path} in {summary['seconds']}s")
    return 0


def main(argv: list[str] | None = None) -> int:
    return config_command_main("python -m data_gen.warmup", "warmup", _description(), run_command, argv)
