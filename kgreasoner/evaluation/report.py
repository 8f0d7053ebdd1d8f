"""Summaries of per-question records: overall and per hop count, as JSON and Markdown.

Per method: `n`, `hits1`, `f1`, `em`, `format_valid` (rates over the questions), `errors`
(questions whose method raised), and mean cost per question: `llm_calls`, `prompt_tokens`,
`completion_tokens`, `kg_queries`, `wall_time` (seconds). `by_hops` repeats n / Hits@1 / F1 / EM
per hop count. `failures` counts the failure categories of wrong answers
(`kgreasoner.evaluation.failures`). `distinct` counts distinct question texts and `hits1_distinct`
averages Hits@1 over them (each the mean of its rows): PQL-2H's grouped test split holds one question
104 times in 160 rows, which row-level Hits@1 weighs 104-fold. The report's header names the
dataset, split and split scheme.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kgreasoner.evaluation.failures import failure_table, summarize_failures

RATES = ("hits1", "f1", "em", "format_valid")
COSTS = ("llm_calls", "prompt_tokens", "completion_tokens", "kg_queries", "wall_time")


@dataclass
class RunInfo:
    """What was evaluated: shown at the top of every report and stored in its JSON."""

    dataset: str
    split: str
    split_scheme: str
    seed: int | None = None
    kg: str = ""
    llm: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def describe_split(self) -> str:
        seed = f", seed {self.seed}" if self.seed is not None else ""
        return f"{self.split} split ({self.split_scheme} scheme{seed})"


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def summarize(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Rates, mean costs and the per-hop breakdown of one method's records."""
    summary: dict[str, Any] = {"n": len(records)}
    for key in RATES:
        summary[key] = _mean([float(r[key]) for r in records])
    by_question: dict[str, list[float]] = {}
    for index, r in enumerate(records):
        by_question.setdefault(str(r.get("question", index)), []).append(float(r["hits1"]))
    summary["distinct"] = len(by_question)
    summary["hits1_distinct"] = _mean([_mean(v) for v in by_question.values()])
    summary["errors"] = sum(1 for r in records if r.get("error"))
    summary["cost"] = {key: _mean([float(r[key]) for r in records]) for key in COSTS}
    by_hops: dict[str, dict[str, float]] = {}
    for hops in sorted({int(r["hops"]) for r in records}):
        group = [r for r in records if int(r["hops"]) == hops]
        by_hops[str(hops)] = {
            "n": len(group),
            **{k: _mean([float(r[k]) for r in group]) for k in ("hits1", "f1", "em")},
            "kg_queries": _mean([float(r["kg_queries"]) for r in group]),
        }
    summary["by_hops"] = by_hops
    summary["failures"] = summarize_failures(records)
    return summary


def render_markdown(info: RunInfo, summaries: dict[str, dict[str, Any]]) -> str:
    """The Markdown report: header, one row per method, then Hits@1 per hop count."""
    lines = [f"# Evaluation: {info.dataset}, {info.describe_split()}", ""]
    if info.kg:
        lines.append(f"- KG: `{info.kg}`")
    if info.llm:
        lines.append(f"- LLM: `{info.llm}`")
    lines += ["- F1/EM are over answer sets; Hits@1 scores the first answer; costs are means per question.", ""]
    lines += [
        "| method | n | Hits@1 | F1 | EM | format-valid | errors | LLM calls | prompt tok | completion tok "
        "| KG queries | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, s in summaries.items():
        c = s["cost"]
        lines.append(
            f"| {name} | {s['n']} | {s['hits1']:.3f} | {s['f1']:.3f} | {s['em']:.3f} | {s['format_valid']:.3f} | "
            f"{s['errors']} | {c['llm_calls']:.2f} | {c['prompt_tokens']:.0f} | {c['completion_tokens']:.0f} | "
            f"{c['kg_queries']:.2f} | {c['wall_time']:.3f} |"
        )
    for name, s in summaries.items():
        if s.get("distinct", s["n"]) < s["n"]:
            lines += [
                "",
                f"{name}: the {s['n']} questions hold {s['distinct']} distinct texts; Hits@1 over distinct "
                f"questions (each the mean of its rows) {s['hits1_distinct']:.3f}.",
            ]
    lines += _hop_table(
        "Hits@1 by hop count (n in parentheses):", summaries, lambda group: f"{group['hits1']:.3f} ({group['n']})"
    )
    # A policy that learned to search searches about as often as the question has hops.
    lines += _hop_table(
        "KG queries per question by hop count:", summaries, lambda group: f"{group.get('kg_queries', 0.0):.2f}"
    )
    lines += failure_table(summaries)
    return "\n".join(lines) + "\n"


def _hop_table(title: str, summaries: dict[str, dict[str, Any]], cell) -> list[str]:
    """A method x hop-count table of `cell(by_hops group)`; no lines when no summary has hop groups."""
    hops = sorted({h for s in summaries.values() for h in s["by_hops"]}, key=int)
    if not hops:
        return []
    lines = ["", title, "", "| method | " + " | ".join(f"{h}-hop" for h in hops) + " |", "|---|" + "---|" * len(hops)]
    for name, s in summaries.items():
        lines.append(
            f"| {name} | " + " | ".join(cell(s["by_hops"][h]) if h in s["by_hops"] else "-" for h in hops) + " |"
        )
    return lines


def write_report(out_dir: str | Path, info: RunInfo, summaries: dict[str, dict[str, Any]]) -> tuple[Path, Path]:
    """`summary.json` and `summary.md` in `out_dir`; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = {
        "dataset": info.dataset,
        "split": info.split,
        "split_scheme": info.split_scheme,
        "seed": info.seed,
        "kg": info.kg,
        "llm": info.llm,
        **info.extra,
        "methods": summaries,
    }
    json_path, md_path = out / "summary.json", out / "summary.md"
    json_path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    md_path.write_text(render_markdown(info, summaries), encoding="utf-8")
    return json_path, md_path
