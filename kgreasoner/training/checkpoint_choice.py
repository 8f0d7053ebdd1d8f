"""The run's final model (`dev_eval.choose_final: best_dev`): the warm-up or one of GRPO's saves, chosen on the
whole dev split.

The candidates are the warm-up (episode 1's step 0: the model GRPO started from) and every saved step of every
episode, each measured by greedy Hits@1 on the whole dev split (`BestKeeper`; the periodic dev curve of
`DevEval` stays on its sample). Each becomes a step-log row with `"candidate": 1`, its Hits@1 overall and per
hop count, and the number of questions of each hop count.

The rule (`judge`): a candidate is eligible only if no hop count's Hits@1 lies more than one standard error
below the warm-up's, that error being the warm-up's own, sqrt(p (1 - p) / n) for its rate p on the n dev
questions of that hop count. At p = 0 or 1 that error is 0: a hop count the warm-up answered wholly must stay
whole (any miss refuses), and one it never answered cannot fall. The warm-up is always eligible, so a run never
ends below its start. Among the eligible the highest overall Hits@1 wins, the later one on ties.

The choice so far is kept aside in `run_dir/best` (with `run_dir/best.json` naming it) when it is a save in the
middle of an episode, so `save_total_limit` never removes it; the warm-up's weights (`recipe.model`) and each
episode's last step (`episode-<k>/final`) are kept anyway. At the end `apply_choice` copies the chosen weights
into the last episode's `final` (what evaluation reads; that episode's last step stays in its last
`checkpoint-N`) and writes `run_dir/chosen.json`: every candidate's figures, those the guard refused and for
which hop counts, and the winner. Weights are copied only after the checkpoint of the same step is complete, so
a resumed run (whose step log drops rows after its checkpoint) never points at weights it lost; a run restarted
from scratch without `--resume` can, and then the choice is among the candidates whose weights exist, as the
warning says.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from kgreasoner.training.common import last_complete_checkpoint, save_final
from kgreasoner.training.grpo_rollout import greedy_verdicts

BEST_DIR = "best"
BEST_RECORD = "best.json"
CHOSEN = "chosen.json"
CANDIDATE = "candidate"
HITS = "dev_split/hits1"
WARMUP = (1, 0)  # (episode, step) of the model GRPO started from
RULE = (
    "the highest Hits@1 on the whole dev split (the later on ties) among the warm-up and every save whose every hop "
    "count's Hits@1 is at least the warm-up's less one standard error of it, sqrt(p(1-p)/n) (0 at p = 0 or 1)"
)
logger = logging.getLogger(__name__)  # apply_choice runs on the main process alone


def hop_key(hops: int) -> str:
    return f"{HITS}_hop{hops}"


def count_key(hops: int) -> str:
    return f"dev_split/questions_hop{hops}"


def candidate_row(right: list[bool], hops: list[int]) -> dict[str, float]:
    """A candidate's figures from its verdict on each dev question and that question's hop count."""
    row: dict[str, float] = {CANDIDATE: 1, HITS: sum(right) / len(right)}
    for h in sorted(set(hops)):
        picked = [r for r, n in zip(right, hops) if n == h]
        row[hop_key(h)] = sum(picked) / len(picked)
        row[count_key(h)] = len(picked)
    return row


def read_rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def point(row: dict) -> tuple[int, int]:
    return row["episode"], row["step"]


def candidates(rows: list[dict]) -> list[dict]:
    """The candidate rows (warm-up and saves, on the whole dev split), in run order."""
    return sorted((r for r in rows if r.get(CANDIDATE) and HITS in r), key=point)


def warmup_row(rows: list[dict]) -> dict | None:
    """The warm-up's candidate row, if measured."""
    return next((r for r in candidates(rows) if point(r) == WARMUP), None)


def by_hop(row: dict) -> dict[int, float]:
    prefix = HITS + "_hop"
    return {int(key[len(prefix) :]): value for key, value in row.items() if key.startswith(prefix)}


def floors(warmup: dict | None) -> dict[int, float]:
    """Per hop count, the lowest Hits@1 a candidate may have: the warm-up's less one standard error of it."""
    if warmup is None:
        return {}
    out = {}
    for hops, p in by_hop(warmup).items():
        out[hops] = p - math.sqrt(p * (1 - p) / warmup[count_key(hops)])
    return out


def refused_for(row: dict, floor: dict[int, float]) -> list[int]:
    """The hop counts on which `row` falls below the guard's floor (1e-12: float noise is no fall)."""
    rates = by_hop(row)
    return [hops for hops, low in sorted(floor.items()) if rates.get(hops, 0.0) < low - 1e-12]


def judge(rows: list[dict], available: set[tuple[int, int]] | None = None) -> tuple[dict | None, list[dict]]:
    """The winner among the candidates (among `available` (episode, step) points when given; None when there is no
    candidate) and each candidate's verdict: its point, figures, the hop counts the guard refused it for."""
    floor = floors(warmup_row(rows))
    verdicts: list[dict[str, Any]] = [
        {"row": r, "refused_for_hops": [] if point(r) == WARMUP else refused_for(r, floor)} for r in candidates(rows)
    ]
    eligible = [
        v["row"] for v in verdicts if not v["refused_for_hops"] and (available is None or point(v["row"]) in available)
    ]
    return max(eligible, key=lambda r: (r[HITS], point(r)), default=None), verdicts


def choose(rows: list[dict], available: set[tuple[int, int]] | None = None) -> dict | None:
    """The winning candidate row (`judge`)."""
    return judge(rows, available)[0]


def episode_ends(rows: list[dict]) -> dict[int, int]:
    """Each episode's last candidate step: its last save, at the episode's final step (the warm-up is none)."""
    ends: dict[int, int] = {}
    for row in candidates(rows):
        if point(row) != WARMUP:
            ends[row["episode"]] = max(ends.get(row["episode"], 0), row["step"])
    return ends


class BestKeeper(TrainerCallback):
    """Measures the warm-up (episode 1's step 0) and every saved step on the whole dev split, writes each as a
    candidate row of the step log, and copies the weights of a save into `run_dir/best` when it is the run's choice
    so far (every rank together: the evaluation and the copy are collectives under ZeRO-3). Each question is
    rolled out greedily through the run's own `rollouts` in calls of at most `batch_size` rows
    (`grpo_rollout.greedy_verdicts`), on the backend the run trains with."""

    def __init__(self, trainer, root: Path, episode: int, base: str, examples, rollouts, batch_size: int, step_log):
        from kgreasoner.records.sampling import hop_count

        self.trainer = trainer
        self.root = root
        self.episode = episode
        self.base = base
        self.examples = examples
        self.hops = [hop_count(e) for e in examples]
        self.rollouts = rollouts  # grpo_rollout.PolicyRollouts
        self.batch_size = batch_size
        self.step_log = step_log  # grpo_callbacks.StepLog: `path` and `append(step, figures)`

    def on_train_begin(self, args, state, control, **kwargs):
        from accelerate.utils import broadcast_object_list

        # The main process has already cut the step log back to the resumed step (RolloutMetrics comes first).
        measured = True
        if state.is_world_process_zero:
            record = self.root / BEST_RECORD
            if record.is_file():
                kept = json.loads(record.read_text(encoding="utf-8"))
                if (kept["episode"], kept["step"]) > (self.episode, state.global_step):
                    record.unlink()  # from a run this one restarts before it: its weights are not this run's
            measured = (self.episode, state.global_step) in {
                point(r) for r in candidates(read_rows(self.step_log.path))
            }
        measured = broadcast_object_list([measured])[0]
        if (self.episode, state.global_step) == WARMUP or (state.global_step > 0 and not measured):
            # the warm-up; or a resumed checkpoint whose evaluation the interruption lost
            self._measure(state)

    def on_save(self, args, state, control, **kwargs):
        self._measure(state)

    def _measure(self, state) -> None:
        from accelerate.utils import broadcast_object_list

        verdicts = greedy_verdicts(self.rollouts, self.trainer, self.examples, self.batch_size)
        row = candidate_row([right for right, _ in verdicts], self.hops)
        wins = False
        if state.is_world_process_zero:
            self.step_log.append(state.global_step, row)
            best = choose(read_rows(self.step_log.path))
            wins = best is not None and point(best) == (self.episode, state.global_step)
        wins = broadcast_object_list([wins])[0]
        if not wins or (self.episode, state.global_step) == WARMUP or state.global_step >= state.max_steps:
            return  # the warm-up's folder, or the episode's final, holds these weights
        save_final(self.trainer, self.root / BEST_DIR, self.base)
        if self.trainer.is_world_process_zero():
            record = {"episode": self.episode, "step": state.global_step, HITS: row[HITS]}
            (self.root / BEST_RECORD).write_text(json.dumps(record) + "\n", encoding="utf-8")


def model_folder(model: str) -> Path:
    """The folder holding `model`'s files: itself, or its snapshot in the local hub cache."""
    if Path(model).is_dir():
        return Path(model)
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(model, local_files_only=True))


def _figures(row: dict) -> dict:
    return {
        "episode": row["episode"],
        "step": row["step"],
        "dev_hits1": row[HITS],
        "by_hop": {str(h): p for h, p in sorted(by_hop(row).items())},
    }


def apply_choice(root: Path, step_log: Path, last_episode: int, choose_final: str, warmup: str) -> dict:
    """Put the chosen weights in the last episode's `final` and write `run_dir/chosen.json` (main process).

    `warmup` is the model GRPO started from (a folder or a hub name)."""
    rows = read_rows(step_log)
    ends = episode_ends(rows)
    last_final = root / f"episode-{last_episode}" / "final"
    last = next((r for r in candidates(rows) if point(r) == (last_episode, ends.get(last_episode))), None)
    summary: dict = {"choose_final": choose_final}
    chosen, source = last, last_final
    if choose_final == "best_dev" and last is not None:
        available = {WARMUP, *ends.items()}
        if (root / BEST_RECORD).is_file():
            record = json.loads((root / BEST_RECORD).read_text(encoding="utf-8"))
            available.add((record["episode"], record["step"]))
        best, verdicts = judge(rows)
        chosen = choose(rows, available)
        assert best is not None and chosen is not None  # `last` is a candidate, and one of `available`
        if best is not chosen:
            logger.warning(
                "the best dev checkpoint (episode %d, step %d) was not kept (a run restarted without "
                "--resume?); choosing among the kept ones",
                *point(best),
            )
        if point(chosen) == WARMUP:
            source = model_folder(warmup)
        elif point(chosen) not in ends.items():
            source = root / BEST_DIR
        else:
            source = root / f"episode-{chosen['episode']}" / "final"
        summary["rule"] = RULE
        summary["warmup_floor_by_hop"] = {str(h): low for h, low in sorted(floors(warmup_row(rows)).items())}
        summary["candidates"] = [
            {
                **_figures(v["row"]),
                "warmup": point(v["row"]) == WARMUP,
                "refused_for_hops": v["refused_for_hops"],
                "weights_kept": point(v["row"]) in available,
            }
            for v in verdicts
        ]
    if source != last_final:
        staged = last_final.with_name(last_final.name + ".chosen")
        if staged.exists():
            shutil.rmtree(staged)
        shutil.copytree(source, staged)
        shutil.rmtree(last_final)
        staged.rename(last_final)
    checkpoint = last_complete_checkpoint(last_final.parent)
    last_step = last["step"] if last else int(checkpoint.rsplit("-", 1)[1]) if checkpoint else None
    summary |= {
        "episode": chosen["episode"] if chosen else last_episode,
        "step": chosen["step"] if chosen else last_step,
        "dev_hits1": chosen[HITS] if chosen else None,
        "warmup": chosen is not None and point(chosen) == WARMUP,
        "source": str(source),
        "last": {"episode": last_episode, "step": last_step, "dev_hits1": last[HITS] if last else None},
    }
    (root / CHOSEN).write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    return summary
