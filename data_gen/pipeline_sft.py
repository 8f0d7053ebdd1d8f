"""SFT data for every LLM step of a pipeline baseline (ToG or SoG), written by the gold-path teacher.

The same-backbone comparison (the paper's Table 2 at our scale): a tiny model cannot
follow a pipeline's prompts, so it is fine-tuned on them like our model is on its warm-up
trajectories, from the same gold paths, with the same architecture and budget.

For each question of the train (and dev) split, the REAL method (`ToGMethod`, `SoGMethod`, with
the configured `tog` / `sog` settings) runs over the dataset's KG with the gold-path teacher
(`kgreasoner.baselines.gold_teacher`) as its LLM. Every LLM step it takes becomes one record: the
step's prompt (masked) and the teacher's reply as the method received it, cut at the method's stop
strings (trained; `kgreasoner.training.warmup_data` appends the eos token where generation
stops). The pipeline's own control flow (beam, tool calls, transcript) makes the prompts, so the
prompts at evaluation have the same form, as long as the method settings are the same (ToG's
`few_shot` included; `configs/tiny-cpu/pipeline_sft.yaml` turns it off).

Each question gets its own teacher, which knows only that question: PQL-3H has 8 question texts
shared by questions with other gold paths and answers, and a teacher that looks questions up by
text would answer one of them from the other's path.

Steps the teacher has no rule for are not written (the method received a placeholder it cannot
read) and are counted. Empty replies (ToG relation pruning where no gold relation is listed: the
teacher keeps none) are written, so the model learns to end its reply at once there, and counted.
With `tokenizer`, records longer than `max_length` tokens (encoded exactly as SFT encodes them)
are dropped and counted, and token statistics go in the summary. The summary also gives the
teacher-driven method's Hits@1 per split: the ceiling of the pipeline with a perfect LLM on this KG.

    python -m data_gen.pipeline_sft --config configs/tiny-cpu/pipeline_sft.yaml [--set key=value ...]
    kgreasoner pipeline-sft --config configs/tiny-cpu/pipeline_sft.yaml --set method=sog
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from kgreasoner.baselines.base import Method
from kgreasoner.baselines.gold_teacher import GoldTeacher
from kgreasoner.baselines.sog import SoGConfig, SoGMethod
from kgreasoner.baselines.tog import ToGConfig, ToGMethod
from kgreasoner.config import add_config_arguments, config_command_main, count_or_all, describe, load_config
from kgreasoner.evaluation.metrics import hits_at_1
from kgreasoner.kg.base import KnowledgeGraph
from kgreasoner.llm import Completion, ScriptedLLM
from kgreasoner.records.schema import QAExample
from kgreasoner.records.splits import DEFAULT_SPLIT_SCHEME, SCHEMES, SPLIT_SCHEME_HELP
from kgreasoner.records.trajectories import Segment, WarmupRecord, write_warmup
from kgreasoner.training.warmup_data import encode_record

PIPELINE_METHODS = ("tog", "sog")
NO_RULE = "\x00no rule"
"""What the scripted client returns where the teacher has no rule; never written as a reply."""
TEACHER_MAX_TOKENS = 1 << 20
"""The teacher's replies are never cut by a budget (the client's default would cut at 256 words)."""


@dataclass
class PipelineSFTConfig:
    """What `data_gen/pipeline_sft.py` generates, from which data, and where it goes."""

    method: str = field(metadata={"help": "pipeline whose LLM steps are written: tog or sog"})
    dataset: str = field(
        metadata={"help": "dataset folder (kb.tsv + questions.jsonl) or a set name (PQ-2H, PQL-3H, ...)"}
    )
    output: str = field(metadata={"help": "JSONL of WarmupRecord (with `prompt`) to write"})
    data_root: str | None = field(
        default=None,
        metadata={"help": "data root for named benchmarks (default: $KGREASONER_DATA, then ../shared/data)"},
    )
    split_scheme: str = field(default=DEFAULT_SPLIT_SCHEME, metadata={"help": SPLIT_SCHEME_HELP})
    split_seed: int = field(default=0, metadata={"help": "seed of that split"})
    num_examples: int | str | None = field(
        default="all",
        metadata={
            "help": "train-split questions to run (`all` or null: every one); each gives one record per LLM step"
        },
    )
    dev_examples: int | str | None = field(
        default=50,
        metadata={"help": "dev-split questions, for early stopping of SFT (`all`/null: every one; 0: none)"},
    )
    seed: int = field(default=0, metadata={"help": "seed of the question order (which questions a limit keeps)"})
    tog: ToGConfig = field(
        default_factory=ToGConfig,
        metadata={"help": "ToG settings: the same as at evaluation (`kgreasoner eval --set tog.KEY=...`)"},
    )
    sog: SoGConfig = field(default_factory=SoGConfig, metadata={"help": "SoG settings: the same as at evaluation"})
    sog_frontier_cap: int = field(
        default=3, metadata={"help": "teacher: SoG searches at most this many frontier entities per hop"}
    )
    tokenizer: str | None = field(
        default=None,
        metadata={"help": "tokenizer (checkpoint path) to drop records over max_length and report token counts"},
    )
    max_length: int = field(
        default=1024,
        metadata={
            "help": (
                "with tokenizer: records of more tokens (prompt + reply + eos) are dropped and counted (use SFT's "
                "max_length)"
            )
        },
    )
    summary: str | None = field(
        default=None, metadata={"help": "summary JSON path (default: the output path with .summary.json)"}
    )
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})

    def __post_init__(self) -> None:
        if self.method not in PIPELINE_METHODS:
            raise ValueError(f"method must be one of {PIPELINE_METHODS}, got {self.method!r}")
        if self.split_scheme not in SCHEMES:
            raise ValueError(f"split_scheme must be one of {SCHEMES}, got {self.split_scheme!r}")
        if self.sog_frontier_cap < 1:
            raise ValueError(f"sog_frontier_cap must be >= 1, got {self.sog_frontier_cap}")
        if self.max_length < 16:
            raise ValueError(f"max_length must be at least 16, got {self.max_length}")
        self.num_examples = count_or_all(self.num_examples, "num_examples")
        self.dev_examples = count_or_all(self.dev_examples, "dev_examples")

    @property
    def summary_path(self) -> Path:
        if self.summary:
            return Path(self.summary)
        out = Path(self.output)
        return out.with_name(out.name.removesuffix(".jsonl") + ".summary.json")


def build_method(config: PipelineSFTConfig, kg: KnowledgeGraph) -> Method:
    return ToGMethod(kg, config.tog) if config.method == "tog" else SoGMethod(kg, config.sog)


class _Recorder:
    """Forwards a method's LLM calls to the teacher's client and keeps each (prompt, reply) pair."""

    def __init__(self, client: ScriptedLLM) -> None:
        self.client = client
        self.calls: list[tuple[str, str]] = []

    def complete(self, prompt: str, max_tokens: int | None = None, stop: Sequence[str] = ()) -> Completion:
        return self.complete_many([prompt], max_tokens, stop)[0]

    def complete_many(
        self, prompts: Sequence[str], max_tokens: int | None = None, stop: Sequence[str] = ()
    ) -> list[Completion]:
        completions = self.client.complete_many(prompts, TEACHER_MAX_TOKENS, stop)
        self.calls.extend((p, c.text) for p, c in zip(prompts, completions))
        return completions


@dataclass
class QuestionSteps:
    """One question's run: its LLM steps as (kind, prompt, reply) and whether the answer was right."""

    steps: list[tuple[str, str, str]]
    correct: bool


def teacher_steps(method: Method, kg: KnowledgeGraph, example: QAExample, config: PipelineSFTConfig) -> QuestionSteps:
    """Run `method` on one question with a teacher that knows only this question."""
    teacher = GoldTeacher(kg, [example], sog_frontier_cap=config.sog_frontier_cap)
    client = ScriptedLLM([getattr(teacher, config.method)], default=NO_RULE, max_tokens=TEACHER_MAX_TOKENS)
    recorder = _Recorder(client)
    result = method.answer(example, recorder)
    kinds = [step["kind"] for step in result.trace["steps"]]
    if len(kinds) != len(recorder.calls):
        raise RuntimeError(f"{example.id}: {len(recorder.calls)} LLM calls but {len(kinds)} steps in the trace")
    steps = [(kind, prompt, reply) for kind, (prompt, reply) in zip(kinds, recorder.calls)]
    return QuestionSteps(steps, hits_at_1(result.answers, example.answers) > 0)


def generate_records(
    config: PipelineSFTConfig,
    method: Method,
    kg: KnowledgeGraph,
    examples: Sequence[QAExample],
    limit: int | None,
    tokenizer: Any = None,
    label: str = "pipeline",
) -> tuple[list[WarmupRecord], dict[str, Any]]:
    """Records for up to `limit` questions (None: all) in a seeded order, and this split's counts."""
    order = list(examples)
    random.Random(f"{config.seed}|order").shuffle(order)
    order = order[:limit] if limit is not None else order
    records: list[WarmupRecord] = []
    steps_by_kind: Counter[str] = Counter()
    written: Counter[str] = Counter()
    no_rule: Counter[str] = Counter()
    empty: Counter[str] = Counter()
    too_long: Counter[str] = Counter()
    lengths: list[int] = []
    correct = 0
    for example in tqdm(order, desc=label, unit="q", disable=not config.progress):
        run = teacher_steps(method, kg, example, config)
        correct += run.correct
        for index, (kind, prompt, reply) in enumerate(run.steps):
            steps_by_kind[kind] += 1
            if reply == NO_RULE:
                no_rule[kind] += 1
                continue
            if not reply.strip():
                empty[kind] += 1
            record = WarmupRecord(
                id=f"{example.id}/{config.method}/{index}",
                question=example.question,
                topic_entities=tuple(example.topic_entities),
                segments=(Segment(reply, True),),
                hops=example.hops,
                split=example.split,
                prompt=prompt,
            )
            if tokenizer is not None:
                length = len(encode_record(record, tokenizer)["input_ids"])
                if length > config.max_length:
                    too_long[kind] += 1
                    continue
                lengths.append(length)
            written[kind] += 1
            records.append(record)
    counts: dict[str, Any] = {
        "questions": len(order),
        "teacher_hits_at_1": round(correct / max(1, len(order)), 4),
        "steps": dict(sorted(steps_by_kind.items())),
        "records": dict(sorted(written.items())),
        "no_rule": dict(sorted(no_rule.items())),
        "empty_reply": dict(sorted(empty.items())),
        "too_long": dict(sorted(too_long.items())),
    }
    if lengths:
        counts["mean_tokens"] = round(sum(lengths) / len(lengths), 1)
        counts["max_tokens"] = max(lengths)
    return records, counts


def run(config: PipelineSFTConfig) -> dict[str, Any]:
    """Load the data, write the train (and dev) records and the summary; returns the summary."""
    from kgreasoner.data import load_dataset, open_dataset_kg

    started = time.perf_counter()
    dataset = load_dataset(
        config.dataset, split_scheme=config.split_scheme, seed=config.split_seed, root=config.data_root
    )
    kg = open_dataset_kg(dataset)
    method = build_method(config, kg)
    tokenizer = None
    if config.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(config.tokenizer)
    records: list[WarmupRecord] = []
    by_split: dict[str, Any] = {}
    for split, limit in (("train", config.num_examples), ("dev", config.dev_examples)):
        if limit == 0:
            continue
        made, by_split[split] = generate_records(
            config, method, kg, dataset.split(split), limit, tokenizer, f"{config.method} {split}"
        )
        records.extend(made)
    write_warmup(records, config.output)
    summary: dict[str, Any] = {
        "method": config.method,
        "dataset": config.dataset,
        "dataset_name": dataset.name,
        "split_scheme": config.split_scheme,
        "split_seed": config.split_seed,
        "settings": _settings(config),
        "records": len(records),
        "by_split": by_split,
        "mean_prompt_chars": round(sum(len(r.prompt or "") for r in records) / max(1, len(records)), 1),
        "mean_reply_chars": round(sum(len(r.completion) for r in records) / max(1, len(records)), 1),
        "max_length": config.max_length if tokenizer is not None else None,
        "output": str(config.output),
        "seconds": round(time.perf_counter() - started, 2),
    }
    path = config.summary_path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


def _settings(config: PipelineSFTConfig) -> dict[str, Any]:
    """The method settings the records were made with: evaluation must use the same."""
    settings = asdict(config.tog if config.method == "tog" else config.sog)
    if config.method == "sog":
        settings["teacher_frontier_cap"] = config.sog_frontier_cap
    return settings


# --- command line ----------------------------------------------------------------------------------
_HELP = "write SFT data for every LLM step of tog or sog, answered by the gold-path teacher (same-backbone comparison)"


def _description() -> str:
    return f"{_HELP}.\n\nFields of the --config YAML (PipelineSFTConfig):\n{describe(PipelineSFTConfig)}"


def register(subparsers: argparse._SubParsersAction) -> None:
    """The `pipeline-sft` subcommand of `kgreasoner`."""
    parser = subparsers.add_parser(
        "pipeline-sft", help=_HELP, description=_description(), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_config_arguments(parser)
    parser.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    config = load_config(PipelineSFTConfig, args.config, args.overrides)
    summary = run(config)
    print(json.dumps({k: summary[k] for k in ("method", "dataset_name", "records", "by_split")}, indent=2))
    print(f"wrote {summary['output']} and {config.summary_path} in {summary['seconds']}s")
    return 0


def main(argv: list[str] | None = None) -> int:
    return config_command_main("python -m data_gen.pipeline_sft", "pipeline-sft", _description(), run_command, argv)


if __name__ == "__main__":
    raise SystemExit(main())
