"""How the grid's models carry out their plans, read from evaluation traces (docs/results/pathquestion-grid.md).

Experimental: it counts what the line templates write, for that one results page.

    python bench/pathquestion_traces.py OUT/eval-off [EVAL ...] [--relation-format words]

One Markdown row per `kgreasoner eval` folder (its run.json names the dataset, split scheme and seed, and
kgreasoner.jsonl holds the traces):
- plan exact: the first `Path: ...` the model wrote names the gold path's relations in order, each as the
  warm-up writes it (`relation_key`);
- wrong after an exact plan: of those, the questions with Hits@1 0;
- written lines: the triple lines the model wrote in its thinking whose head handle and relation are those of
  a line the tool showed in the same trajectory; of these, how many carry the tail handle of such a shown line
  ("tail right"), and how many its tail handle and label both ("label right").
The plan and the written lines are those of the line templates (configs/tiny-cpu/templates-line.yaml) with
entity handles on; other templates give zeros.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from pathlib import Path

from data_gen.warmup import PLAN_SEPARATOR
from kgreasoner.data import load_dataset
from kgreasoner.protocol import HANDLE_PATTERN, TRIPLES_CLOSE, TRIPLES_OPEN
from kgreasoner.records.splits import SCHEMES
from kgreasoner.retrieval.tool import RELATION_FORMATS, relation_key

PLAN = re.compile(r"Path: (.*?)\.(?:\s|$)")
_HANDLE = HANDLE_PATTERN
# (E1 label, relation words, E2 label): labels may hold commas, relation words do not
LINE = re.compile(rf"\(({_HANDLE}) ([^\n]*?), ([^,\n]+), ({_HANDLE}) ([^\n]*?)\)(?=\.|\n|$)")
BLOCK = re.compile(f"({re.escape(TRIPLES_OPEN)}.*?{re.escape(TRIPLES_CLOSE)})", re.DOTALL)


@dataclass
class TraceCounts:
    questions: int = 0
    hits: float = 0.0
    plan_exact: int = 0
    wrong_after_exact_plan: int = 0
    written_lines: int = 0
    tail_right: int = 0
    label_right: int = 0

    def row(self, name: str) -> str:
        share = self.tail_right / self.written_lines if self.written_lines else 0.0
        return (
            f"| {name} | {self.questions} | {self.hits / max(self.questions, 1):.3f} | {self.plan_exact} "
            f"| {self.wrong_after_exact_plan} | {self.written_lines} | {self.tail_right} ({share:.3f}) "
            f"| {self.label_right} |"
        )


HEADER = (
    "| evaluation | questions | Hits@1 | plan exact | wrong after an exact plan | written lines "
    "| tail right | label right |\n" + "|---" * 8 + "|"
)


def plan_of(relations: tuple[str, ...], relation_format: str) -> list[str]:
    """The gold path as a plan names it (`^` before a backward relation)."""
    return [relation_key(relation, relation_format) for relation in relations]


def written_plan(text: str) -> list[str] | None:
    match = PLAN.search(text)
    return [part.strip() for part in match.group(1).split(PLAN_SEPARATOR)] if match else None


def line_counts(text: str) -> tuple[int, int, int]:
    """(written lines matching a shown head and relation, with the right tail handle, with handle and label)."""
    shown: dict[tuple[str, str], set[tuple[str, str]]] = {}
    written = []
    for part in BLOCK.split(text):
        if part.startswith(TRIPLES_OPEN):
            for head, _, relation, tail, label in LINE.findall(part):
                shown.setdefault((head, relation), set()).add((tail, label.strip()))
        else:
            written += LINE.findall(part)
    lines = tail = label_too = 0
    for head, _, relation, handle, label in written:
        options = shown.get((head, relation))
        if not options:
            continue
        lines += 1
        tail += any(handle == t for t, _ in options)
        label_too += (handle, label.strip()) in options
    return lines, tail, label_too


def count(folder: Path, relation_format: str) -> TraceCounts:
    run_path = folder / "run.json"
    try:
        run = json.loads(run_path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{run_path}: {error}") from error
    missing = [key for key in ("dataset", "split", "split_scheme", "seed") if key not in run]
    if missing:
        raise ValueError(f"{run_path}: missing {', '.join(missing)}")
    # a dataset whose examples carry their split ("given") ignores scheme and seed
    scheme = run["split_scheme"] if run["split_scheme"] in SCHEMES else SCHEMES[0]
    dataset = load_dataset(run["dataset"], split=run["split"], split_scheme=scheme, seed=run["seed"] or 0)
    gold = {e.id: e.gold_paths[0] for e in dataset.examples if e.gold_paths}
    counts = TraceCounts()
    path = folder / "kgreasoner.jsonl"
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            record = json.loads(line)
            question, hits = record["id"], float(record["hits1"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{path}:{number}: not an evaluation record ({error})") from error
        if question not in gold:
            raise ValueError(
                f"{path}:{number}: question {question!r} is not in {run['dataset']}'s "
                f"{run['split']} split with a gold path"
            )
        text = (record.get("trace") or {}).get("text", "")
        counts.questions += 1
        counts.hits += hits
        if written_plan(text) == plan_of(gold[question], relation_format):
            counts.plan_exact += 1
            counts.wrong_after_exact_plan += hits == 0
        lines, tail, label = line_counts(text)
        counts.written_lines += lines
        counts.tail_right += tail
        counts.label_right += label
    return counts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="[experimental] " + __doc__.splitlines()[0])
    parser.add_argument("evaluations", nargs="+", type=Path, help="`kgreasoner eval --out` folders")
    parser.add_argument(
        "--relation-format",
        choices=RELATION_FORMATS,
        default="words",
        help="the tool's relation_format in the warm-up (the grid's: words)",
    )
    args = parser.parse_args(argv)
    rows = []
    for folder in args.evaluations:
        try:
            rows.append(count(folder, args.relation_format).row(str(folder)))
        except (OSError, ValueError) as error:
            parser.exit(1, f"pathquestion_traces: {error}\n")
    print("\n".join([HEADER, *rows]))


if __name__ == "__main__":
    main()
