"""The demo's report folder: `report.md`, `results.json` and the figures (no checkpoints).

- `sft_loss.png`: training and dev loss of the SFT warm-up over steps (its trainer_state.json);
- `grpo_curves.png`: what GRPO learned over its steps (`kgreasoner plot`): reward and components,
  groups with one reward, entropy, length, searches and correct answers by hop count, dev Hits@1.
The results table merges the two evaluation folders: the kgreasoner method on the SFT and on the
GRPO checkpoint, and the oracle (gold path walked with the same tool).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SFT_METHOD = "kgreasoner (warm-up SFT)"
GRPO_METHOD = "kgreasoner (warm-up + GRPO)"
BASE_METHOD = "kgreasoner (base, no warm-up)"
NO_WARMUP_GRPO_METHOD = "kgreasoner (base + GRPO)"
SFT_ONLY_METHOD = "kgreasoner (SFT only)"
BASELINES_LEFT_OUT = (
    "The pipeline baselines (ToG, SoG, PaRoG) and IO/CoT prompt the LLM with instructions in natural "
    "language; a tiny model trained here from scratch only on the search protocol cannot follow them, so "
    "the demo leaves them out (`bench/same_backbone.sh` SFT-trains ToG/SoG steps into the tiny model instead). "
    "The oracle walks each question's gold path with the same tool: the retrieval upper bound."
)


def sft_log_history(run_dir: str | Path) -> list[dict[str, Any]]:
    """The SFT run's logged rows (train loss, eval loss by step) from its newest checkpoint's trainer_state.json."""
    from kgreasoner.training.common import last_complete_checkpoint

    last = last_complete_checkpoint(run_dir)
    if last is None:
        return []
    return json.loads((Path(last) / "trainer_state.json").read_text(encoding="utf-8")).get("log_history", [])


def plot_sft_loss(history: list[dict[str, Any]], output: Path) -> Path:
    """Training loss per logged step and dev loss per evaluation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [(r["step"], r["loss"]) for r in history if "loss" in r and "step" in r]
    dev = [(r["step"], r["eval_loss"]) for r in history if "eval_loss" in r and "step" in r]
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    if train:
        ax.plot(*zip(*train), label="train")
    if dev:
        ax.plot(*zip(*dev), marker="o", label="dev")
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("loss (model-written tokens)")
    ax.set_title("SFT warm-up")
    ax.legend()
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=120)
    plt.close(fig)
    return output


def _methods(demo: Any) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Summaries of the three methods by report label, and the first evaluation's summary (for its header)."""

    def load(label: str) -> dict[str, Any]:
        return json.loads((Path(demo.paths["eval"]) / label / "summary.json").read_text(encoding="utf-8"))

    first = load(demo.first_eval)
    if not demo.config.rl:
        return {SFT_ONLY_METHOD: first["methods"]["kgreasoner"], "oracle": first["methods"]["oracle"]}, first
    grpo = load("grpo")
    labels = (SFT_METHOD, GRPO_METHOD) if demo.config.sft_warmup else (BASE_METHOD, NO_WARMUP_GRPO_METHOD)
    return {
        labels[0]: first["methods"]["kgreasoner"],
        labels[1]: grpo["methods"]["kgreasoner"],
        "oracle": first["methods"]["oracle"],
    }, first


def _data_line(demo: Any) -> str:
    prepared = Path(demo.paths["data"]) / "prepare.json"
    if prepared.exists():
        p = json.loads(prepared.read_text(encoding="utf-8"))
        scheme = p["split_scheme"] + ("" if p["split_seed"] is None else f", seed {p['split_seed']}")
        paths = p["gold_paths"]
        derived = (
            f"; gold paths derived for {paths['derived']} questions (none found for {paths['not_found']})"
            if paths["derived"] or paths["not_found"]
            else ""
        )
        return f"{p['dataset']} ({p['source']}), {scheme} split{derived}"
    return f"synthetic KG and questions (seed {demo.config.seed}, grouped split made by the generator)"


def write_report(demo: Any) -> Path:
    """The report of a `kgreasoner.demo.Demo` run (its settings, paths, stages and their store); its path.

    The demo is passed in rather than imported: this module sits below the demo, which runs it as
    its last stage."""
    from kgreasoner.evaluation.report import RunInfo, render_markdown
    from kgreasoner.training.plots import plot_runs

    out = Path(demo.paths["report"])
    out.mkdir(parents=True, exist_ok=True)
    figures = []
    if demo.config.sft_warmup:
        plot_sft_loss(sft_log_history(demo.paths["sft"]), out / "sft_loss.png")
        figures.append(("SFT warm-up loss", "sft_loss.png"))
    if demo.config.rl:
        plot_runs([demo.paths["grpo"]], out / "grpo_curves.png")
        figures.append(("GRPO: what it learned, step by step", "grpo_curves.png"))

    methods, sft_run = _methods(demo)
    stages: dict[str, dict[str, Any]] = demo.store.records()
    threads = next((record.get("threads", "?") for record in stages.values()), "?")  # the first stage's
    info = RunInfo(sft_run["dataset"], sft_run["split"], sft_run["split_scheme"], sft_run["seed"])
    table = render_markdown(info, methods).splitlines()[2:]  # without the title and its blank line
    kg = stages.get("kg", {}).get("result", {})
    model = stages.get("model", {}).get("result", {})
    params = model.get("parameters", {})
    total = sum(r["seconds"] for r in stages.values())
    ranking = "" if "ranking" in demo.config.tool else ", ranking=gat (the demo's ranker)"
    lines = [
        f"# kgreasoner demo: {demo.source}",
        "",
        "The whole pipeline on one CPU machine: KG store, GAT ranker, warm-up trajectories, a tiny Qwen3 "
        "trained from scratch with a short SFT warm-up on a small sample, GRPO (episode 1 on all "
        "training questions, episode 2 on the hard cases: those episode 1's rollouts got partly or wholly "
        "wrong), evaluation. The warm-up teaches the format and the search habit; RL is measured by its gain "
        "over its own warm-up. Every stage's command is listed below.",
        "",
        *(_gain_lines(methods) if demo.config.rl else []),
        f"- Data: {_data_line(demo)}.",
        f"- KG: {kg.get('triples', 0):,} triples, {kg.get('nodes', 0):,} nodes, "
        f"{kg.get('relations', 0)} relation types (embedded memory store).",
        f"- Model: {params.get('total', 0):,} parameters ({params.get('non_embedding', 0):,} without embeddings), "
        f"word vocabulary of {model.get('vocab', 0):,} tokens.",
        f"- Tool: {', '.join(f'{k}={v}' for k, v in demo.config.tool.items())}{ranking}; "
        f"rollout {', '.join(f'{k}={v}' for k, v in demo.config.rollout.items())}; greedy decoding in evaluation.",
        f"- Turns: {demo.fit_turn_budget().line()}.",
        f"- Seeds: {demo.config.seed} (data and training); wall time of the stages {total / 60:.1f} min "
        f"with {threads} torch thread(s).",
        "",
        f"## Results: {info.describe_split()}",
        "",
        *table,
        "",
        BASELINES_LEFT_OUT,
        "",
        "## Training curves",
        "",
    ]
    for title, name in figures:
        lines += [f"![{title}]({name})", ""]
    lines += ["## Stages", "", "| # | stage | wall time | result |", "|---|---|---|---|"]
    order = [stage.name for stage in demo.stages() if stage.name in stages]
    for number, name in enumerate(order, 1):
        record = stages[name]
        lines.append(f"| {number} | {name} | {_duration(record['seconds'])} | {record['result']['line']} |")
    lines += [
        "",
        "Wall time is that of the run that finished the stage (a resumed SFT or GRPO counts from its checkpoint).",
        "",
        "Commands (each stage from the shell, in order):",
        "",
        "```",
    ]
    for name in order:
        lines += stages[name]["commands"]
    if demo.config.rl:
        lines.append(f"kgreasoner plot {demo.paths['grpo']} --out {demo.paths['report']}/grpo_curves.png")
    lines += ["```", ""]
    report = out / "report.md"
    report.write_text("\n".join(lines), encoding="utf-8")
    results = {
        "dataset": demo.source,
        "split": info.describe_split(),
        "methods": methods,
        "stages": {name: {"seconds": r["seconds"], **r["result"]} for name, r in stages.items()},
    }
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n", encoding="utf-8")
    return report


def _gain_lines(methods: dict[str, dict[str, Any]]) -> list[str]:
    """One line: GRPO's Hits@1 against its own warm-up's, overall and per hop count (test split, greedy)."""
    first, second = list(methods)[:2]
    before, after = methods[first], methods[second]
    hops = [h for h in sorted(after["by_hops"], key=int) if h in before["by_hops"]]
    per_hop = "; ".join(
        f"{h}-hop {before['by_hops'][h]['hits1']:.3f} -> {after['by_hops'][h]['hits1']:.3f}" for h in hops
    )
    return [
        f"**What RL added:** test Hits@1 {before['hits1']:.3f} -> {after['hits1']:.3f} "
        f"({100 * (after['hits1'] - before['hits1']):+.1f} points){'; ' + per_hop if per_hop else ''}.",
        "",
    ]


def _duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
