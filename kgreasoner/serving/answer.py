"""`kgreasoner answer`: questions in, answers with their full trajectories out.

    kgreasoner answer --model checkpoints/grpo --kg memory:data/kb.tsv \\
        --question "what timezone is utah in" --topic Utah
    kgreasoner answer --llm openai:http://127.0.0.1:8000/v1 --tokenizer CKPT --questions qs.jsonl --kg ... --json
    kgreasoner answer --llm hf:ckpt --dataset PQ-2H --split test --limit 20

Input: one `--question` with its `--topic`s (names or ids, repeatable), a JSONL file of
`{"question", "topic_entities", ["id", "answers"]}` lines (our QA schema works as is), or a
`--dataset` split (whose KB is then the KG unless `--kg` names another). Generation goes through
the same `AnswerService` as `kgreasoner serve`. Output: a readable trace per question (searches,
the triples the tool returned, backtracks, the answer), or with `--json` one JSON object per line
(the `/v1/answer` body, plus `gold` and `hit` when the input had answers).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

from kgreasoner.config import add_config_arguments, load_config
from kgreasoner.llm.spec import SPEC_FORMS, describe_forms
from kgreasoner.protocol import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    SEARCH_CLOSE,
    SEARCH_OPEN,
    THINK_CLOSE,
    THINK_OPEN,
    TRIPLES_CLOSE,
    TRIPLES_OPEN,
)
from kgreasoner.terminal import json_line, printable

MAX_BLOCK_LINES = 12
"""Tool-block lines printed per search in the trace (the rest is counted)."""

_BLOCKS = re.compile(
    "|".join(
        f"({re.escape(a)}.*?{re.escape(b)})"
        for a, b in ((SEARCH_OPEN, SEARCH_CLOSE), (TRIPLES_OPEN, TRIPLES_CLOSE), (ANSWER_OPEN, ANSWER_CLOSE))
    ),
    re.DOTALL,
)


class _Style:
    """ANSWER bold green, searches cyan, errors red, tool text dim; plain when colour is off."""

    def __init__(self, color: bool) -> None:
        self.color = color

    def __call__(self, text: str, code: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.color else text


def render_trace(record: dict[str, Any], color: bool = False) -> str:
    """A terminal view of one answer record (see `AnswerService.record`)."""
    style = _Style(color)
    # every text of the record is data (question, labels, model output): `printable` before it is styled
    topics = ", ".join(
        printable(f"{t['name']} ({t['id']})" if t["name"] != t["id"] else t["id"]) for t in record["topic_entities"]
    )
    lines = [style(f"Q {printable(str(record['id']))}: {printable(record['question'])}", "1"), f"  topic: {topics}"]
    text = record.get("trajectory")
    if text is None:
        lines.append(style(f"  error: {printable(str(record.get('error')))}", "31"))
        return "\n".join(lines)
    searches = list(record.get("searches") or [])
    calls = iter(searches)
    position = 0
    for match in _BLOCKS.finditer(text):
        _thought(lines, text[position : match.start()])
        position = match.end()
        block = match.group(0)
        if match.group(1):
            call = next(calls, None)
            query = printable(block[len(SEARCH_OPEN) : -len(SEARCH_CLOSE)].strip())
            if call is None:
                lines.append(style(f"  search   {query}", "36") + "  (not run: turn limit)")
                continue
            verb = "backtrack" if call["backtrack"] else "search   "
            label = printable(call.get("label") or "")
            target = f" -> {label}" if label and label != query else ""
            outcome = (
                style(f"[{printable(call['error'])}]", "31")
                if call["error"]
                else f"[{call['num_triples']} triples{', cut' if call['truncated'] else ''}]"
            )
            lines.append(style(f"  {verb} {query}{target}", "36") + f"  {outcome}")
        elif match.group(2):
            body = block[len(TRIPLES_OPEN) : -len(TRIPLES_CLOSE)].strip("\n").split("\n")
            shown = body[:MAX_BLOCK_LINES]
            lines.extend(style(f"           {printable(line)}", "2") for line in shown)
            if len(body) > len(shown):
                lines.append(style(f"           ... {len(body) - len(shown)} more lines", "2"))
        else:
            raw = printable(block[len(ANSWER_OPEN) : -len(ANSWER_CLOSE)].strip())
            resolved = printable(" | ".join(record.get("answers") or []))
            answer = raw if resolved == raw or not resolved else f"{raw} = {resolved}"
            lines.append(style(f"  answer   {answer}", "1;32"))
    _thought(lines, text[position:])
    usage = record.get("usage") or {}
    facts = [
        f"finish: {printable(str(record['finish_reason']))}",
        f"{usage.get('searches', 0)} searches",
        f"{usage.get('backtracks', 0)} backtracks",
    ]
    if usage.get("completion_tokens") is not None:
        facts.append(f"{usage['completion_tokens']} model tokens")
    facts.append(f"{usage.get('seconds', 0):.2f} s")
    if record.get("error"):
        facts.append(style(f"error: {printable(str(record['error']))}", "31"))
    if "hit" in record:
        verdict = style("correct", "32") if record["hit"] else style("wrong", "31")
        facts.append(f"{verdict} (gold: {printable(' | '.join(record['gold']))})")
    lines.append("  " + "; ".join(facts))
    return "\n".join(lines)


def _thought(lines: list[str], text: str) -> None:
    text = " ".join(text.replace(THINK_OPEN, " ").replace(THINK_CLOSE, " ").split())
    if text:
        lines.append(f"  think    {printable(text)}")


# --------------------------------------------------------------------------- the command
def register(subparsers: argparse._SubParsersAction) -> None:
    from kgreasoner.config import describe
    from kgreasoner.records.splits import add_split_scheme_argument
    from kgreasoner.serving.config import ServeConfig

    parser = subparsers.add_parser(
        "answer",
        help="answer questions with a trained checkpoint, showing each trajectory",
        description=__doc__
        + "\nFields of the --config YAML (ServeConfig; nested sections tool, rollout):\n"
        + describe(ServeConfig),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    model = parser.add_mutually_exclusive_group()
    model.add_argument("--llm", help=f"{describe_forms(SPEC_FORMS)} (overrides the config's llm)")
    model.add_argument("--model", type=Path, help="a local checkpoint: the same as --llm hf:PATH")
    parser.add_argument("--kg", help="KG spec (default: the config's kg, or the --dataset's own KB)")
    parser.add_argument("--tokenizer", help="the served model's tokenizer directory, for vllm:URL and openai backends")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--question", help="one question (with --topic)")
    source.add_argument("--questions", type=Path, help="a JSONL file: question, topic_entities [, id, answers]")
    source.add_argument("--dataset", help="a dataset name or folder (kgreasoner.data.load_dataset)")
    parser.add_argument("--topic", action="append", default=[], help="a topic entity name or id (repeatable)")
    parser.add_argument("--split", default="test", choices=("train", "dev", "test"), help="--dataset split")
    add_split_scheme_argument(parser)
    parser.add_argument("--seed", type=int, default=0, help="seed of the --dataset split scheme")
    parser.add_argument("--limit", type=int, default=None, help="only the first N questions")
    parser.add_argument(
        "--temperature", type=float, default=None, help="sampling temperature (default: the config's, 0)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per line instead of the trace")
    parser.add_argument("--out", type=Path, help="write the output here instead of stdout")
    parser.add_argument("--color", choices=("auto", "always", "never"), default="auto", help="colour in the trace")
    add_config_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kgreasoner.serving.config import ServeConfig
    from kgreasoner.serving.service import AnswerService
    from kgreasoner.serving.validation import AnswerOptions, RequestError

    config = load_config(ServeConfig, args.config, args.overrides)
    if args.llm:
        config.llm = args.llm
    elif args.model:
        config.llm = f"hf:{args.model}"
    if args.kg:
        config.kg = args.kg
    if args.tokenizer:
        config.tokenizer = args.tokenizer
    config.__post_init__()  # validate what the flags changed
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {args.limit}")
    if args.question is not None and not args.topic:
        raise ValueError("--question needs at least one --topic")
    items, kg = _inputs(args, config)
    if kg is None and not config.kg:
        raise ValueError("name the knowledge graph with --kg (or use --dataset, whose KB is used)")
    if kg is None:
        service = AnswerService.open(config)
    else:
        from kgreasoner.serving.service import open_backend

        backend, name, close = open_backend(config)
        service = AnswerService(config, backend, kg, model_name=name, close=close)
    options = AnswerOptions(temperature=args.temperature)
    try:
        requests = []
        for where, item in items:
            try:
                requests.append(service.prepare(item["question"], item["topic_entities"], options, item.get("id")))
            except RequestError as err:
                raise ValueError(f"{where}: {err}") from err
        for request in requests:  # the command line waits as long as it takes
            request.deadline = None
        out = open(args.out, "w", encoding="utf-8") if args.out else sys.stdout
        try:
            hits = _write(service, items, requests, args, out)
        finally:
            if args.out:
                out.close()
    finally:
        service.close()
    if hits is not None:
        print(f"Hits@1 {sum(hits) / len(hits):.3f} over {len(hits)} questions", file=sys.stderr)
    return 0


def _write(service: Any, items: list, requests: list, args: argparse.Namespace, out: TextIO) -> list[bool] | None:
    from kgreasoner.evaluation.metrics import hits_at_1

    color = args.color == "always" or (
        args.color == "auto" and not args.out and sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    )
    hits: list[bool] = []
    step = service.config.max_batch_size
    for start in range(0, len(requests), step):  # print as batches finish, not all at the end
        for (_, item), answered in zip(items[start : start + step], service.answer(requests[start : start + step])):
            record = service.record(answered)
            gold = item.get("answers")
            if gold:
                record["gold"] = [a.name for a in gold]
                record["hit"] = bool(hits_at_1(record["answers"], gold))
                hits.append(record["hit"])
            if args.json:
                out.write(json_line(record) + "\n")
            else:
                out.write(render_trace(record, color) + "\n\n")
            out.flush()
    return hits or None


def _inputs(args: argparse.Namespace, config: Any) -> tuple[list[tuple[str, dict]], Any]:
    """(where, {question, topic_entities, id?, answers?}) items, and the dataset's KG when one is used."""
    if args.question is not None:
        return [("--question", {"question": args.question, "topic_entities": list(args.topic)})], None
    if args.questions is not None:
        items = list(_read_questions(args.questions))
        return items[: args.limit], None
    from kgreasoner.data import load_dataset, open_dataset_kg

    dataset = load_dataset(args.dataset, split=args.split, split_scheme=args.split_scheme, seed=args.seed)
    examples = dataset.examples[: args.limit]
    items = [
        (
            f"{dataset.name}:{e.id}",
            {
                "id": e.id,
                "question": e.question,
                "answers": list(e.answers),
                "topic_entities": [{"id": t.id, "name": t.name} for t in e.topic_entities],
            },
        )
        for e in examples
    ]
    return items, (None if args.kg or config.kg else open_dataset_kg(dataset))


def _read_questions(path: Path) -> Iterable[tuple[str, dict]]:
    from kgreasoner.records.schema import QAExample, SchemaError, iter_json_lines

    for where, data in iter_json_lines(path):
        if not isinstance(data, dict) or "question" not in data or "topic_entities" not in data:
            raise ValueError(f"{where}: each line needs 'question' and 'topic_entities'")
        item = {"question": data["question"], "topic_entities": data["topic_entities"]}
        if data.get("id") is not None:
            item["id"] = str(data["id"])
        if data.get("answers"):
            try:
                item["answers"] = list(QAExample.from_dict({"id": "x", **data}).answers)
            except SchemaError as err:
                raise ValueError(f"{where}: {err}") from err
        yield where, item
