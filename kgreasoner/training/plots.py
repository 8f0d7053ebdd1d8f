"""`kgreasoner plot RUN_DIR...`: what a GRPO run learned, from its `steps.jsonl`.

Panels over training steps (the paper's Figure 4 and what shows learning rather than reward):
reward and each component (smoothed), the share of groups whose rollouts all got one reward (no
gradient), the share whose rollouts all got one answer reward (all right or all wrong: no answer signal),
by hop count, beside the share of groups guided by a gold row, entropy, response length (model-written
tokens), searches and correct answers per rollout by hop count, and greedy dev Hits@1 (overall and
by hop count; `dev_eval.steps`). Given
several runs (for example with and without hard-case sampling) their curves share the panels,
labelled by run folder name; later episodes continue after earlier ones (dotted lines).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

STEP_LOG = "steps.jsonl"
"""The per-step log every GRPO run writes into its run_dir."""

PANELS = (
    ("reward (smoothed)", r"reward|rewards/(search|format|answer)_reward/mean", True),
    ("groups with one reward (no gradient)", r"frac_reward_zero_std", True),
    ("groups with one answer reward, by hops; guided", r"rollout/answer_tied(_hop\d+)?|rollout/guided", True),
    ("entropy (model tokens)", r"entropy", True),
    ("response length (model tokens)", r"completions/mean_length", True),
    ("searches per rollout, by hops", r"rollout/searches(_hop\d+)?", True),
    ("correct per rollout, by hops", r"rollout/correct_hop\d+", True),
    ("dev Hits@1 (greedy)", r"dev/hits1(_hop\d+)?", False),
)
"""(title, metric keys as a regular expression, smoothed?)"""


def read_steps(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / STEP_LOG
    if not path.exists():
        raise FileNotFoundError(f"{path}: no step log (is {run_dir} a GRPO run_dir?)")
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number}: not valid JSON ({err.msg})") from err
    return rows


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average over `window` points (fewer at the start)."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def continuous_steps(rows: list[dict]) -> list[int]:
    """Each row's step counted across episodes: an episode's steps continue after the one before."""
    x: list[int] = []
    offset, seen = 0, set()
    for row in rows:
        if row["episode"] not in seen:
            seen.add(row["episode"])
            offset = max(x, default=0)
        x.append(offset + row["step"])
    return x


def _short(key: str) -> str:
    """`rewards/answer_reward/mean` -> `answer`, `dev/hits1_hop2` -> `hop2`, `reward` -> `total`,
    `rollout/answer_tied` -> `all`."""
    if key == "reward":
        return "total"
    if key in ("rollout/answer_tied", "rollout/guided"):
        return "all" if key.endswith("tied") else "guided"
    part = key.split("/")[1] if key.startswith("rewards/") else key.split("/")[-1]
    return part.removesuffix("_reward").split("_")[-1] if "_" in part or key.startswith("rewards/") else "all"


def plot_runs(run_dirs: list[str | Path], output: str | Path) -> Path:
    """Draw the panels for every run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = 4
    rows_needed = -(-len(PANELS) // columns)
    fig, axes = plt.subplots(rows_needed, columns, figsize=(4.2 * columns, 3.3 * rows_needed), squeeze=False)
    axes = axes.flatten()
    for run_dir in run_dirs:
        rows = read_steps(run_dir)
        x = continuous_steps(rows)
        name = Path(run_dir).name
        trained = sum(1 for r in rows if "loss" in r)
        window = max(1, trained // 20)
        for ax, (_, pattern, smoothed) in zip(axes, PANELS):
            keys = sorted({k for r in rows for k in r if re.fullmatch(pattern, k)})
            for key in keys:
                points = [(xi, row[key]) for xi, row in zip(x, rows) if key in row]
                xs, ys = zip(*points)
                shown = smooth(list(ys), window) if smoothed else list(ys)
                label = name if len(keys) == 1 else f"{name}: {_short(key)}"
                ax.plot(xs, shown, label=label, marker=None if smoothed else "o", markersize=3)
        for boundary in sorted({x[i] for i in range(1, len(rows)) if rows[i]["episode"] != rows[i - 1]["episode"]}):
            for ax in axes[: len(PANELS)]:
                ax.axvline(boundary - 0.5, color="grey", linestyle=":", linewidth=1)
    for ax, (title, _, _) in zip(axes, PANELS):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("training step")
        if ax.lines:
            ax.legend(fontsize=7)
    for ax in axes[len(PANELS) :]:
        ax.axis("off")
    fig.tight_layout()
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=110)
    plt.close(fig)
    return output


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plot",
        help="learning curves of GRPO runs: reward and components, zero-variance groups, entropy, searches and "
        "dev Hits@1 (PNG)",
    )
    parser.add_argument("runs", nargs="+", help="GRPO run_dir(s) holding steps.jsonl")
    parser.add_argument("--out", default="grpo_curves.png", help="PNG to write")
    parser.set_defaults(func=lambda args: print(f"wrote {plot_runs(args.runs, args.out)}") or 0)
