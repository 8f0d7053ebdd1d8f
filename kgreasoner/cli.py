"""The `kgreasoner` command. Each area registers its own subcommands from its own module.

Only the chosen command's module is imported: most of them pull in torch and transformers, which
take seconds, and `kgreasoner --help` should not wait for all of them.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from kgreasoner.terminal import printable

COMMANDS: dict[str, tuple[str, str]] = {
    # the stores' own commands, plus `kg embed`, which needs the retrieval layer's encoder
    "kg": ("kgreasoner.retrieval.commands", "build, serve, inspect and embed knowledge-graph stores"),
    "prepare-data": ("kgreasoner.data.prepare", "write a dataset as a folder with fixed splits and gold paths"),
    "warmup": ("data_gen.warmup", "generate warm-up SFT trajectories by running the search tool along gold paths"),
    "pipeline-sft": (
        "data_gen.pipeline_sft",
        "write SFT data for every LLM step of tog or sog (same-backbone baseline)",
    ),
    "build-tiny": ("kgreasoner.models", "train a tokenizer and save a freshly initialised tiny model checkpoint"),
    "preflight": ("kgreasoner.training.preflight", "check a GPU recipe (TRL config, data, model, memory per GPU)"),
    "plot": ("kgreasoner.training.plots", "learning curves of GRPO runs (PNG)"),
    "eval": ("kgreasoner.evaluation.commands", "evaluate methods (kgreasoner, tog, sog, parog, io, cot, oracle)"),
    "answer": ("kgreasoner.serving.commands", "answer questions with a trained checkpoint, showing each trajectory"),
    "export": ("kgreasoner.serving.commands", "merge a LoRA adapter (or copy a checkpoint) for `vllm serve`"),
    "serve": ("kgreasoner.serving.commands", "HTTP service: /v1/answer, /v1/chat/completions, /health, /metrics"),
    "demo": ("kgreasoner.demo", "the whole pipeline on one CPU machine, with a report"),
    "ablate": ("kgreasoner.ablate", "the paper's ablations at small scale: one run per variant and seed, one table"),
}
"""command -> (module whose `register(subparsers)` defines it, one line for `kgreasoner --help`)."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with every command listed; only `command`'s module (all of them when None) is imported."""
    parser = argparse.ArgumentParser(
        prog="kgreasoner",
        description="Teach a reasoning LLM to search a knowledge graph inside its thinking.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    # A module registers all of its commands, so the chosen command's siblings need no placeholder.
    chosen = {module for name, (module, _) in COMMANDS.items() if command is None or name == command}
    for module in dict.fromkeys(module for module, _ in COMMANDS.values()):
        if module in chosen:
            importlib.import_module(module).register(subparsers)
    for name, (module, help_text) in COMMANDS.items():
        if module not in chosen:
            subparsers.add_parser(name, help=help_text)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((word for word in argv if not word.startswith("-")), None)
    parser = build_parser(command if command in COMMANDS else "")
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (FileNotFoundError, ValueError) as err:
        # messages quote the data they refuse (a label, a line): its control characters are escaped
        print(f"kgreasoner {args.command}: error: {printable(str(err), lines=True)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
