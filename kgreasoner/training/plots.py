"""`kgreasoner plot RUN_DIR...`: the paper's Figure 4 from GRPO runs' `steps.jsonl`.

Three panels over training steps: mean reward, response length (model-written tokens) and
retrieval count per rollout. Given several runs (for example with and without hard-case
sampling) their curves share the panels, labelled by run folder name.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

STEP_LOG = "steps.jsonl"
"""The per-step log every GRPO run writes into its output_dir."""

PANELS = (
    ("reward", "mean reward"),
    ("completions/mean_length", "response length (model tokens)"),
    ("rollout/searches", "retrievals per rollout"),
)


def read_steps(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / STEP_LOG
    if not path.exists():
        raise FileNotFoundError(f"{path}: no step log (is {run_dir} a GRPO output_dir?)")
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number}: not valid JSON ({err.msg})") from err
    return rows


def plot_runs(run_dirs: list[str | Path], output: str | Path) -> Path:
    """Draw the panels for every run; steps of later episodes continue after earlier ones."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 3.4))
    for run_dir in run_dirs:
        rows = read_steps(run_dir)
        x, offset, last = [], 0, {}
        for row in rows:
            if row["episode"] not in last:
                offset = max(x, default=0)
            last[row["episode"]] = row["step"]
            x.append(offset + row["step"])
        for ax, (key, _) in zip(axes, PANELS):
            points = [(xi, row[key]) for xi, row in zip(x, rows) if key in row]
            if points:
                ax.plot(*zip(*points), label=Path(run_dir).name)
        for boundary in sorted({x[i] for i in range(1, len(rows)) if rows[i]["episode"] != rows[i - 1]["episode"]}):
            for ax in axes:
                ax.axvline(boundary - 0.5, color="grey", linestyle=":", linewidth=1)
    for ax, (_, title) in zip(axes, PANELS):
        ax.set_title(title)
        ax.set_xlabel("training step")
        ax.legend(fontsize=8)
    fig.tight_layout()
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=120)
    plt.close(fig)
    return output


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("plot", help="reward / length / retrieval curves of GRPO runs (PNG)")
    parser.add_argument("runs", nargs="+", help="GRPO output_dir(s) holding steps.jsonl")
    parser.add_argument("--out", default="grpo_curves.png", help="PNG to write")
    parser.set_defaults(func=lambda args: print(f"wrote {plot_runs(args.runs, args.out)}") or 0)
