"""The PathQuestion generalisation grid's table from cells written by `bench/pathquestion_grid.sh`.

    python bench/pathquestion_table.py OUT [OUT ...]

One row per cell and checkpoint (SFT, SFT + GRPO): Hits@1 unconstrained / constrained / constrained with
quotes, Hits@1 over distinct question texts, format validity and the failure categories of the constrained
evaluation, the SFT steps (and the best checkpoint's), and the wall and CPU minutes of training (ranker,
warm-up, tokenizer and model, SFT, and GRPO for the GRPO row; evaluation not counted), from `times.tsv`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

MODES = ("off", "on", "quotes")
TRAINING_STAGES = {"sft": ("ranker", "warmup", "build", "sft"), "grpo": ("ranker", "warmup", "build", "sft", "grpo")}
FAILURES = (
    ("copy_failure", "copy"),
    ("loop_or_turn_limit", "loop"),
    ("invalid_format", "invalid"),
    ("answer_not_in_context", "not in context"),
    ("data_ambiguity", "ambiguous"),
)


def read_times(cell: Path) -> dict[str, tuple[float, float]]:
    """{stage: (wall seconds, CPU seconds)} from the cell's times.tsv; a stage run twice counts twice."""
    times: dict[str, tuple[float, float]] = {}
    path = cell / "times.tsv"
    if not path.is_file():
        return times
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fields = line.split("\t")
        if len(fields) != 4:
            raise ValueError(f"{path}:{number}: expected stage, wall, user, system; got {line!r}")
        wall, cpu = times.get(fields[0], (0.0, 0.0))
        times[fields[0]] = (wall + float(fields[1]), cpu + float(fields[2]) + float(fields[3]))
    return times


def sft_steps(cell: Path) -> str:
    """'steps (best)' of the SFT run, from its last checkpoint's trainer state."""
    states = sorted(
        (cell / "sft").glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[1])
    )
    if not states:
        return "—"
    state = json.loads(states[-1].read_text())
    best = state.get("best_model_checkpoint")
    return f"{state['global_step']:,}" + (f" ({int(best.rsplit('-', 1)[1]):,})" if best else "")


def summary(cell: Path, prefix: str, mode: str) -> dict | None:
    path = cell / f"{prefix}-{mode}" / "summary.json"
    return json.loads(path.read_text())["methods"]["kgreasoner"] if path.is_file() else None


def joined(results: dict[str, dict | None], key: str) -> str:
    return " / ".join(f"{r[key]:.3f}" if r else "—" for r in results.values())


def failures(result: dict) -> str:
    """The constrained evaluation's failure counts, wrong relations by hop first."""
    f = result["failures"]
    parts = []
    if f["counts"]["wrong_relation"]:
        hops = ", ".join(f"h{hop}: {n}" for hop, n in sorted(f["wrong_relation_by_hop"].items()))
        parts.append(f"wrong relation {f['counts']['wrong_relation']} ({hops})")
    parts += [f"{label} {f['counts'][key]}" for key, label in FAILURES if f["counts"].get(key)]
    return "; ".join(parts) or "—"


def rows(cell: Path) -> list[str]:
    meta = json.loads((cell / "warmup.summary.json").read_text())
    times = read_times(cell)
    out = []
    for model, prefix, label in (("sft", "eval", "SFT"), ("grpo", "grpo-eval", "SFT + GRPO")):
        results = {mode: summary(cell, prefix, mode) for mode in MODES}
        if not any(results.values()):
            continue
        first = next(r for r in results.values() if r)
        stages = TRAINING_STAGES[model]
        if all(stage in times for stage in stages):
            wall = sum(times[s][0] for s in stages) / 60
            cpu = sum(times[s][1] for s in stages) / 60
            budget = f"{wall:.1f} / {cpu:.1f}"
        else:
            budget = "—"
        constrained = results["on"]
        out.append(
            " | ".join(
                [
                    "",
                    meta["dataset"],
                    meta["split_scheme"],
                    label,
                    sft_steps(cell),
                    budget,
                    f"{first['n']} ({first['distinct']})",
                    joined(results, "hits1"),
                    joined(results, "hits1_distinct"),
                    f"{constrained['format_valid']:.3f}" if constrained else "—",
                    failures(constrained) if constrained else "—",
                    "",
                ]
            ).strip()
        )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cells", nargs="+", type=Path, help="OUT folders of bench/pathquestion_grid.sh")
    args = parser.parse_args(argv)
    header = (
        "| set | split | training | SFT steps (best) | training wall / CPU min | test rows (distinct) "
        "| Hits@1 off / on / quotes | distinct Hits@1 off / on / quotes | format-valid (on) | failures (on) |\n"
        + "|---" * 10
        + "|"
    )
    try:
        table = [row for cell in args.cells for row in rows(cell)]
    except (OSError, ValueError) as error:
        parser.exit(1, f"pathquestion_table: {error}\n")
    print("\n".join([header, *table]))


if __name__ == "__main__":
    main()
