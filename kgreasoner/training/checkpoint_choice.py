"""The run's final model chosen by dev Hits@1 among its saved checkpoints (`choose_final: best_dev`).

The dev evaluation runs at every save step as well as every `dev_eval_steps`, and its step-log row at a
save step carries `"checkpoint": 1`: those rows are the candidates, across all episodes. Episode 1's
step 0 (the warm-up model) is not one: the choice is among what GRPO trained.

The best candidate so far is kept aside in `run_dir/best` (with `run_dir/best.json` naming it) when it
is not the last step of its episode, whose weights `episode-<k>/final` holds anyway; so
`save_total_limit` never removes it. At the end `apply_choice` picks the candidate with the highest
dev Hits@1 (the later one on ties), copies its weights into the last episode's `final` (what
evaluation reads; that episode's last step stays in its last `checkpoint-N`) and writes
`run_dir/chosen.json`. Weights are copied only after the checkpoint of the same step is complete, so
a resumed run (whose step log drops rows after its checkpoint) never points at weights it lost; a
run restarted from scratch without `--resume` can, and then the choice is among the candidates whose
weights exist, as the warning says.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from transformers import TrainerCallback

from kgreasoner.training.common import save_final

BEST_DIR = "best"
BEST_RECORD = "best.json"
CHOSEN = "chosen.json"
HITS = "dev/hits1"
logger = logging.getLogger(__name__)  # apply_choice runs on the main process alone


def read_rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def candidates(rows: list[dict]) -> list[dict]:
    """Dev rows measured at a saved checkpoint, in run order."""
    return sorted((r for r in rows if r.get("checkpoint") and HITS in r), key=lambda r: (r["episode"], r["step"]))


def choose(rows: list[dict], available: set[tuple[int, int]] | None = None) -> dict | None:
    """The candidate with the highest dev Hits@1, the later one on ties; among `available`
    (episode, step) points when given. None when there is no candidate."""
    pool = [r for r in candidates(rows) if available is None or (r["episode"], r["step"]) in available]
    return max(pool, key=lambda r: (r[HITS], r["episode"], r["step"]), default=None)


def episode_ends(rows: list[dict]) -> dict[int, int]:
    """Each episode's last candidate step: its last save, at the episode's final step."""
    ends: dict[int, int] = {}
    for row in candidates(rows):
        ends[row["episode"]] = max(ends.get(row["episode"], 0), row["step"])
    return ends


class BestKeeper(TrainerCallback):
    """Copies the weights of a saved step into `run_dir/best` when its dev Hits@1 is the best of the run
    so far (every rank together: the copy is a collective under ZeRO-3)."""

    def __init__(self, root: Path, episode: int, base: str, dev_eval, step_log: Path) -> None:
        self.root = root
        self.episode = episode
        self.base = base
        self.dev_eval = dev_eval
        self.step_log = step_log
        self.best = float("-inf")

    def on_train_begin(self, args, state, control, **kwargs):
        from accelerate.utils import broadcast_object_list

        # The main process has already cut the step log back to the resumed step (RolloutMetrics comes first).
        best = None
        if state.is_world_process_zero:
            best = choose(read_rows(self.step_log))
            record = self.root / BEST_RECORD
            if record.is_file():
                kept = json.loads(record.read_text(encoding="utf-8"))
                if (kept["episode"], kept["step"]) > (self.episode, state.global_step):
                    record.unlink()  # from a run this one restarts before it: its weights are not this run's
        self.best = broadcast_object_list([best[HITS] if best else float("-inf")])[0]

    def on_save(self, args, state, control, **kwargs):
        step, hits = self.dev_eval.latest
        if step != state.global_step or hits < self.best:
            return
        self.best = hits
        if state.global_step >= state.max_steps:
            return  # the episode's final holds these weights
        trainer = self.dev_eval.trainer
        save_final(trainer, self.root / BEST_DIR, self.base)
        if trainer.is_world_process_zero():
            record = {"episode": self.episode, "step": state.global_step, HITS: hits}
            (self.root / BEST_RECORD).write_text(json.dumps(record) + "\n", encoding="utf-8")


def apply_choice(root: Path, step_log: Path, last_episode: int, choose_final: str) -> dict:
    """Put the chosen weights in the last episode's `final` and write `run_dir/chosen.json` (main process)."""
    rows = read_rows(step_log)
    ends = episode_ends(rows)
    last_final = root / f"episode-{last_episode}" / "final"
    last = next(
        (r for r in candidates(rows) if (r["episode"], r["step"]) == (last_episode, ends.get(last_episode))), None
    )
    chosen, source = last, last_final
    if choose_final == "best_dev" and last is not None:
        available = {(episode, step) for episode, step in ends.items()}
        if (root / BEST_RECORD).is_file():
            record = json.loads((root / BEST_RECORD).read_text(encoding="utf-8"))
            available.add((record["episode"], record["step"]))
        best, chosen = choose(rows), choose(rows, available)
        assert best is not None and chosen is not None  # `last` is a candidate, and one of `available`
        if best is not chosen:
            logger.warning(
                "the best dev checkpoint (episode %d, step %d) was not kept (a run restarted without "
                "--resume?); choosing among the kept ones",
                best["episode"],
                best["step"],
            )
        point = (chosen["episode"], chosen["step"])
        source = root / BEST_DIR if point not in ends.items() else root / f"episode-{point[0]}" / "final"
    if source != last_final:
        staged = last_final.with_name(last_final.name + ".chosen")
        if staged.exists():
            shutil.rmtree(staged)
        shutil.copytree(source, staged)
        shutil.rmtree(last_final)
        staged.rename(last_final)
    summary = {
        "choose_final": choose_final,
        "episode": chosen["episode"] if chosen else last_episode,
        "step": chosen["step"] if chosen else None,
        "dev_hits1": chosen[HITS] if chosen else None,
        "source": str(source),
        "last": {
            "episode": last_episode,
            "step": last["step"] if last else None,
            "dev_hits1": last[HITS] if last else None,
        },
    }
    (root / CHOSEN).write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    return summary
