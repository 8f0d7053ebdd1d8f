"""Hard cases: the questions the policy itself got partly or wholly wrong in episode 1.

While episode 1 trains, `frontier.GroupLog` writes one row per rollout group to `episode-1/groups.jsonl`:
how many of its question's `of` policy rollouts answered right. The count is taken as the rollouts were
sampled, before a guided group swaps a row for a gold trajectory (or a rollout after a gold prefix), so
gold rows never count; and it is gathered over every rank in TRL's group order, so a group whose
rollouts lie on two ranks still gives one exact row (`frontier.group_rows`).

`hard_examples` reads those rows. Every record kind is eligible, 1-, 2- and 3-hop alike. A question is
hard when its success rate `right / of` is below `hard_cases.threshold` (1.0: any wrong rollout; 0.5: right in
fewer than half its rollouts; all-wrong questions are hard under every threshold above 0). A question
sampled more than once (a second epoch, or a scarce hop count recycled by the stratified order) is judged
by its last group, the policy nearest the hard episode. A question episode 1 never sampled is not hard:
its success is unmeasured; it stays with the rest of the training questions, which the replay share
draws from. When no question is hard, the episode trains on every training question, with a warning.

Replay (`hard_cases.replay`): TRL takes an episode's questions in dataset order, a generation batch at a time,
so `replay_order` lays the episode out batch by batch: that share of every batch comes from the rest of
the training questions, hop counts in turn, so the hop counts the policy already answers (in the synthetic
demo, the 1-hop questions) stay in every stretch of the episode.

The main process writes the set once, to `episode-<k>/hard_cases.jsonl` (id, hops, right, of) and its
counts to `episode-<k>/hard_cases.json`; every rank reads the set back from there, and a resumed run
reads it instead of mining again, so the episode trains on the questions its checkpoints began with.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from pathlib import Path

from accelerate.logging import get_logger

from kgreasoner.training.frontier import GROUPS_FILE, read_groups

HARD_FILE = "hard_cases.jsonl"
SUMMARY_FILE = "hard_cases.json"
logger = get_logger(__name__)


def select_hard(groups: dict[str, dict], threshold: float) -> list[str]:
    """The ids (sorted) of the questions whose last group's success rate `right / of` is below `threshold`."""
    return sorted(i for i, g in groups.items() if g["right"] < threshold * g["of"])


def hard_examples(root: Path, number: int, train_examples: list, threshold: float) -> tuple[list, list]:
    """Hard episode `number`'s hard questions and the rest of `train_examples`, from episode 1's groups
    under `root` (or the set a run before this one saved). Every rank calls it; it returns on every rank
    once the set is on disk."""
    from accelerate import PartialState

    from kgreasoner.records.sampling import hop_count

    state = PartialState()  # also sets up the state the logger reads
    state.wait_for_everyone()  # what the main process wrote before (episode 1's groups) is whole
    folder = root / f"episode-{number}"
    saved = (folder / SUMMARY_FILE).is_file()  # written last: the set beside it is whole
    groups = root / "episode-1" / GROUPS_FILE
    if not saved and not groups.is_file():  # on every rank, before any of them waits for the others
        raise ValueError(
            f"episode {number} trains on hard cases, but {groups} is missing: it is written while "
            "episode 1 trains, so a run from before it was recorded must train episode 1 again"
        )
    state.wait_for_everyone()  # every rank has looked before the main process writes
    if saved:
        made_with = json.loads((folder / SUMMARY_FILE).read_text(encoding="utf-8"))["threshold"]
        if made_with != threshold:
            raise ValueError(
                f"{folder / HARD_FILE} was mined with hard_cases.threshold {made_with}, the recipe says {threshold}: "
                "delete it (and the episode's checkpoints) to mine again, or set it back"
            )
        logger.info("episode %d: the hard cases mined before, %s", number, folder / HARD_FILE)
    elif state.is_main_process:
        _write_hard_set(groups, folder, number, train_examples, threshold)
    state.wait_for_everyone()  # the other ranks read the file next
    hard_ids = {row["id"] for row in _read_rows(folder / HARD_FILE)}
    summary = json.loads((folder / SUMMARY_FILE).read_text(encoding="utf-8"))
    if summary.get("fallback") == "all":
        return list(train_examples), []
    hard = [e for e in train_examples if e.id in hard_ids]
    if not hard:
        raise ValueError(
            f"episode {number}: none of the {len(hard_ids)} hard ids of {folder / HARD_FILE} is a training question"
        )
    logger.info(
        "episode %d: %d hard questions of %d sampled in episode 1 (%s by hops)",
        number,
        len(hard),
        summary["sampled"],
        ", ".join(f"{n} of {h}" for h, n in sorted(Counter(hop_count(e) for e in hard).items())),
    )
    return hard, [e for e in train_examples if e.id not in hard_ids]


def _write_hard_set(path: Path, folder: Path, number: int, train_examples: list, threshold: float) -> None:
    """Mine episode `number`'s set from the groups file `path` into `folder` (the main process)."""
    from kgreasoner.records.sampling import hop_count

    groups = read_groups(path)
    hard = select_hard(groups, threshold)
    train_ids = {e.id for e in train_examples}

    def by_hops(ids) -> dict[str, int]:
        return {str(h): n for h, n in sorted(Counter(groups[i]["hops"] for i in ids).items())}

    summary: dict = {
        "threshold": threshold,
        "sampled": len(groups),
        "hard": len(hard),
        "sampled_by_hops": by_hops(groups),
        "hard_by_hops": by_hops(hard),
        "never_sampled": len(train_ids - set(groups)),
        "never_sampled_by_hops": {
            str(h): n for h, n in sorted(Counter(hop_count(e) for e in train_examples if e.id not in groups).items())
        },
    }
    if not hard:
        logger.warning(
            "episode %d: no question of %s had a success rate below hard_cases.threshold %s; it trains on every "
            "training question",
            number,
            path,
            threshold,
        )
        summary["fallback"] = "all"
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"id": i, "hops": groups[i]["hops"], "right": groups[i]["right"], "of": groups[i]["of"]} for i in hard]
    (folder / HARD_FILE).write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    # the summary marks the set whole: written in full or not at all, so a run killed here mines again
    partial = folder / f"{SUMMARY_FILE}.partial"
    partial.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    partial.replace(folder / SUMMARY_FILE)


def _read_rows(path: Path) -> list[dict]:
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                row = json.loads(line)
                rows.append({**row, "id": str(row["id"])})
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise ValueError(f"{path}:{number}: expected a JSON object with an 'id' ({err})") from err
    return rows


def replay_slots(per_batch: int, share: float) -> int:
    """Replay questions in a batch of `per_batch`: `share` of it to the nearest, at least one while `share` is
    above 0 and at most all but one (a batch keeps a hard question)."""
    if share <= 0:
        return 0
    if per_batch < 2:
        raise ValueError(
            f"hard_cases.replay {share} needs at least 2 questions a generation batch, it takes {per_batch} "
            "(per_device_train_batch_size x steps_per_generation x processes / num_generations): "
            "raise per_device_train_batch_size or set hard_cases.replay: 0"
        )
    return min(max(round(per_batch * share), 1), per_batch - 1)


def replay_order(hard: list, rest: list, per_batch: int, share: float, seed: int) -> list:
    """The hard episode's questions in training order, batch after batch of `per_batch` (TRL's generation
    batch: every rank's questions of one generation, which it takes in dataset order).

    A batch is `per_batch - r` hard questions, in their given order (started over to fill the last batch),
    then r = `replay_slots(per_batch, share)` questions of `rest` (none without `rest`): hop counts in turn,
    fewest hops first, the turn carried from one batch to the next; each hop count's questions in a seeded
    shuffle, shuffled again once all were used. So with at least as many replay slots as hop counts every
    batch holds each hop count, and with fewer, consecutive batches take turns. The same questions, sizes
    and seed give the same order.
    """
    from kgreasoner.records.sampling import hop_count

    slots = replay_slots(per_batch, share) if rest else 0
    pools: dict[int, list] = {}
    for example in sorted(rest, key=lambda e: e.id):
        pools.setdefault(hop_count(example), []).append(example)
    hops = sorted(pools)
    queues: dict[int, list] = {h: [] for h in hops}
    rng = random.Random(f"{seed}|replay")
    take = per_batch - slots
    order: list = []
    for batch in range(math.ceil(len(hard) / take)):
        order += [hard[(batch * take + i) % len(hard)] for i in range(take)]
        for slot in range(slots):
            h = hops[(batch * slots + slot) % len(hops)]
            if not queues[h]:
                queues[h] = list(pools[h])
                rng.shuffle(queues[h])
            order.append(queues[h].pop())
    return order
