"""The frontier episode: train where the policy sometimes succeeds, and replay a share of the rest.

While an episode trains, `GroupLog` writes one row per rollout group to `episode-<k>/groups.jsonl`:
`{"step", "id", "hops", "right", "of"}`, the answers a question's `of` rollouts got right, before any
change to the group (the counts are on-policy). TRL gathers its rewards in rank order and reads
every `num_generations` consecutive rows as one group; the rows are gathered the same way here, so
a group whose rollouts lie on two ranks still gives one exact row. `step` is the first optimiser
step the rollouts train, so a resumed run drops the rows after its checkpoint as the step log does.

`select_frontier` reads episode 1's rows. A question seen more than once (a second epoch, or a
scarce hop count recycled by the stratified order) keeps its last count. The frontier is every
question with 1..of-1 right answers: it is where a group's rewards differ in the answer, so the
gradient teaches answers, not search count and layout. The rest (all right or all wrong) supplies
the replay share, `frontier_replay` of the episode's questions (seeded), so the policy keeps what it
already answers (in the synthetic demo, the 1-hop questions). All-wrong questions in the replay
share are where guided groups (a gold trajectory in a group with no right answer) teach, when on.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from accelerate.logging import get_logger
from transformers import TrainerCallback

GROUPS_FILE = "groups.jsonl"
SUMMARY_FILE = "frontier.json"
logger = get_logger(__name__)


class GroupLog(TrainerCallback):
    """Writes each rollout group's right-answer count (main process); drops rows after a resumed step."""

    def __init__(self, path: Path, num_generations: int) -> None:
        self.path = path
        self.num_generations = num_generations

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.truncate_after(state.global_step)

    def truncate_after(self, step: int) -> None:
        """Keep the rows of steps up to `step`; a fresh start (step 0) keeps none."""
        if not self.path.exists():
            return
        rows = [json.loads(line) for line in self.path.read_text(encoding="utf-8").splitlines() if line.strip()]
        keep = [r for r in rows if 0 < r["step"] <= step]
        self.path.write_text("".join(json.dumps(r) + "\n" for r in keep), encoding="utf-8")

    def record(self, trainer, examples, right) -> None:
        """Every rank passes its questions of one generation batch and each rollout's answer reward (as
        sampled, before any guided row replaces one); the main process appends the groups."""
        from accelerate.utils import gather_object

        from kgreasoner.records.sampling import hop_count

        rollouts = gather_object([(e.id, hop_count(e), r) for e, r in zip(examples, right)])
        if not trainer.accelerator.is_main_process:
            return
        rows = group_rows(rollouts, self.num_generations, trainer.state.global_step + 1)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.writelines(json.dumps(row) + "\n" for row in rows)


def group_rows(rollouts: list[tuple[str, int, float]], num_generations: int, step: int) -> list[dict]:
    """One row per `num_generations` consecutive rollouts (id, hops, answer reward), as TRL groups them."""
    if len(rollouts) % num_generations:
        raise RuntimeError(f"{len(rollouts)} rollouts do not split into groups of {num_generations}")
    rows = []
    for start in range(0, len(rollouts), num_generations):
        group = rollouts[start : start + num_generations]
        if len({question for question, _, _ in group}) != 1:
            raise RuntimeError(
                f"a rollout group holds several questions: {sorted({g[0] for g in group})}; "
                "TRL's sampler no longer keeps a group's rollouts together"
            )
        rows.append(
            {
                "step": step,
                "id": group[0][0],
                "hops": group[0][1],
                "right": int(sum(r > 0 for _, _, r in group)),
                "of": len(group),
            }
        )
    return rows


@dataclass
class FrontierSelection:
    """The questions of a frontier episode and each one's hop count."""

    frontier: list[str]
    replay: list[str]
    hops: dict[str, int]

    def ids(self) -> set[str]:
        return set(self.frontier) | set(self.replay)

    def summary(self) -> dict:
        def by_hops(ids: list[str]) -> dict[str, int]:
            return {str(h): n for h, n in sorted(Counter(self.hops[i] for i in ids).items())}

        return {
            "frontier": len(self.frontier),
            "replay": len(self.replay),
            "frontier_by_hops": by_hops(self.frontier),
            "replay_by_hops": by_hops(self.replay),
        }


def read_groups(path: Path) -> dict[str, dict]:
    """The last row of each question in a groups file (rows are in training order)."""
    last: dict[str, dict] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            last[str(row["id"])] = {"hops": int(row["hops"]), "right": int(row["right"]), "of": int(row["of"])}
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{path}:{number}: not a group row {{id, hops, right, of}}: {err}") from err
    return last


def select_frontier(path: Path, replay_share: float, seed: int, minimum: int = 0) -> FrontierSelection:
    """Questions with 1..of-1 right answers, plus a seeded sample of the rest making up `replay_share`
    of the selection, or more to reach `minimum` questions (TRL trains nothing on an episode with fewer
    questions than one generation batch takes); as many as there are, if fewer."""
    groups = read_groups(path)
    frontier = sorted(i for i, g in groups.items() if 0 < g["right"] < g["of"])
    rest = sorted(set(groups) - set(frontier))
    wanted = max(round(len(frontier) * replay_share / (1.0 - replay_share)), minimum - len(frontier))
    replay = sorted(random.Random(seed).sample(rest, min(wanted, len(rest))))
    return FrontierSelection(frontier, replay, {i: g["hops"] for i, g in groups.items()})


def frontier_examples(
    root: Path, number: int, train_examples: list, replay_share: float, seed: int, minimum: int
) -> list:
    """The training questions of frontier episode `number`, from episode 1's groups, at least `minimum`
    of them where episode 1 saw as many; the main process writes the selection's counts to
    `episode-<number>/frontier.json`.

    When no question is on the frontier (every group all right or all wrong), the episode trains on
    every question episode 1 saw, with a warning, and the summary says so (`fallback`).
    """
    from accelerate import PartialState

    main = PartialState().is_main_process  # also sets up the state the logger reads
    path = root / "episode-1" / GROUPS_FILE
    if not path.is_file():
        raise ValueError(
            f"episode {number} trains on the frontier, but {path} is missing: it is written while "
            "episode 1 trains, so a run from before it was recorded must train episode 1 again"
        )
    selection = select_frontier(path, replay_share, seed, minimum)
    summary = selection.summary()
    ids = selection.ids()
    if not selection.frontier:
        logger.warning(
            "episode %d: no question of %s had some but not all rollouts right; it trains on every "
            "question episode 1 saw",
            number,
            path,
        )
        ids = set(selection.hops)
        summary["fallback"] = "all"
    examples = [e for e in train_examples if e.id in ids]
    if not examples:
        raise ValueError(f"episode {number}: none of the {len(ids)} frontier ids of {path} is a training question")
    if main:
        (root / f"episode-{number}").mkdir(parents=True, exist_ok=True)
        (root / f"episode-{number}" / SUMMARY_FILE).write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    return examples
