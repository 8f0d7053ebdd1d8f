"""Hard-case mining (paper, Section 4.3): keep the questions the warm-up model finds hard.

For each training question with a reference trajectory a (from `data_gen.warmup`), the
warm-up model's loss is L_sft = -(1/T) sum_t log P(a_t | a_<t, q) over the T model-written
tokens. A question is hard when L_sft > epsilon and it needs multi-hop reasoning (hops >= 2).
Later GRPO episodes train only on these.

Under torchrun every rank loads the model on its own device, scores every world_size-th
trajectory, and the losses are gathered, so the threshold and the hard set are those of a single
process scoring everything; the main process writes the files.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from kgreasoner.data.trajectories import WarmupRecord, read_warmup
from kgreasoner.training.warmup_data import encode_record


@dataclass
class HardCaseConfig:
    """Options of `kgreasoner hard-cases` and of the GRPO episodes that compute the hard set."""

    model: str = field(metadata={"help": "the warm-up (SFT) checkpoint that scores the trajectories"})
    trajectories: str = field(metadata={"help": "reference trajectories, one per training question (JSONL)"})
    output: str = field(metadata={"help": "where the hard set goes (JSONL: id, loss, hops)"})
    epsilon: float | None = field(
        default=None, metadata={"help": "loss threshold; None: use `quantile` of the observed losses"}
    )
    quantile: float = field(
        default=0.5, metadata={"help": "with epsilon None, epsilon = this quantile of the multi-hop losses"}
    )
    min_hops: int = field(default=2, metadata={"help": "only questions with at least this many hops are kept"})
    batch_size: int = field(default=16, metadata={"help": "trajectories scored per forward pass"})
    plot: bool = field(default=True, metadata={"help": "write a histogram of the losses next to the output"})

    def __post_init__(self) -> None:
        if not 0.0 <= self.quantile < 1.0:
            raise ValueError(f"quantile must be in [0, 1), got {self.quantile}")


@torch.no_grad()
def per_example_loss(
    model, tokenizer, records: list[WarmupRecord], batch_size: int = 16, progress: bool = True
) -> list[float]:
    """Mean next-token NLL over the model-written tokens of each trajectory (batched, see `batch_losses`)."""
    model.eval()
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    encoded = [encode_record(r, tokenizer) for r in records]
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]["input_ids"]))
    losses = [0.0] * len(encoded)
    for start in tqdm(
        range(0, len(order), batch_size), desc="scoring trajectories", unit="batch", disable=not progress
    ):
        batch = [encoded[i] for i in order[start : start + batch_size]]
        width = max(len(e["input_ids"]) for e in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        attention = torch.zeros_like(ids)
        labels = torch.full_like(ids, -100)
        for row, e in enumerate(batch):
            n = len(e["input_ids"])
            ids[row, :n] = torch.tensor(e["input_ids"])
            attention[row, :n] = 1
            mask = torch.tensor(e["assistant_masks"], dtype=torch.bool)
            labels[row, :n] = torch.where(mask, ids[row, :n], torch.tensor(-100))
        for row, value in enumerate(
            batch_losses(model, ids.to(device), attention.to(device), labels.to(device)).tolist()
        ):
            losses[order[start + row]] = value
    return losses


def batch_losses(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per row, the mean next-token NLL over its labelled positions (labels -100 elsewhere), as float32.

    Only the labelled positions go through the LM head: a trajectory is mostly prompt and masked
    `<triples>`, so projecting every position through the vocabulary was most of the cost.
    """
    from kgreasoner.training.labelled_head import labelled_logits  # imports TRL: not at CLI start

    logits, mask = labelled_logits(model, input_ids, attention_mask, labels)
    nll = torch.nn.functional.cross_entropy(logits, labels[:, 1:][mask], reduction="none")
    sums = nll.new_zeros(len(labels)).index_add_(0, mask.nonzero()[:, 0], nll)
    return sums / mask.sum(dim=1).clamp(min=1)


def select_hard(
    records: list[WarmupRecord], losses: list[float], epsilon: float | None, quantile: float, min_hops: int
) -> tuple[list[dict], float]:
    """The hard set and the threshold used."""
    multi_hop = [loss for r, loss in zip(records, losses) if r.hops >= min_hops]
    if epsilon is None:
        epsilon = float(torch.tensor(multi_hop).quantile(quantile)) if multi_hop else float("inf")
    hard = [
        {"id": r.id, "loss": round(loss, 6), "hops": r.hops}
        for r, loss in zip(records, losses)
        if r.hops >= min_hops and loss > epsilon
    ]
    return hard, epsilon


def mine_hard_cases(config: HardCaseConfig) -> Path:
    """Score the trajectories (sharded over the ranks when launched by torchrun) and write the hard set.

    Every rank must call this; it returns once the output exists, on every rank.
    """
    from accelerate import PartialState

    from kgreasoner.models import inference_dtype, load_model_and_tokenizer

    # One process without torchrun; under it NCCL on GPUs, and gloo on CPU, which accelerate sets
    # up only when told the run is CPU-only (a state made earlier, by a trainer, is reused as it is).
    state = PartialState(cpu=not torch.cuda.is_available())
    device = str(state.device)
    model, tokenizer = load_model_and_tokenizer(config.model, dtype=inference_dtype(state.device.type), device=device)
    records = [r for r in read_warmup(config.trajectories) if r.kind == "gold" and r.split == "train"]
    rank, world = state.process_index, state.num_processes
    shard = per_example_loss(model, tokenizer, records[rank::world], config.batch_size, progress=state.is_main_process)
    losses = _gather_strided(shard, len(records), world)
    output = Path(config.output)
    if state.is_main_process:
        _write_hard_set(config, records, losses, output)
    state.wait_for_everyone()  # the other ranks read the file next
    return output


def _gather_strided(shard: list[float], total: int, world: int) -> list[float]:
    """The losses of all ranks in record order, rank r having scored records r, r + world, ...."""
    if world == 1:
        return shard
    shards: list[list[float]] = [[] for _ in range(world)]  # all_gather_object fills every rank's slot
    torch.distributed.all_gather_object(shards, shard)
    losses = [0.0] * total
    for rank, values in enumerate(shards):
        losses[rank::world] = values
    return losses


def _write_hard_set(config: HardCaseConfig, records: list[WarmupRecord], losses: list[float], output: Path) -> None:
    hard, epsilon = select_hard(records, losses, config.epsilon, config.quantile, config.min_hops)
    output.parent.mkdir(parents=True, exist_ok=True)
    with output.open("w", encoding="utf-8") as handle:
        for row in hard:
            handle.write(json.dumps(row) + "\n")
    summary = {"scored": len(records), "hard": len(hard), "epsilon": epsilon, "min_hops": config.min_hops}
    output.with_suffix(".summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    if config.plot:
        _plot_losses(records, losses, epsilon, output.with_suffix(".png"))


def read_hard_ids(path: str | Path) -> set[str]:
    path = Path(path)
    ids = set()
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                try:
                    ids.add(str(json.loads(line)["id"]))
                except (json.JSONDecodeError, KeyError) as err:
                    raise ValueError(f"{path}:{number}: expected a JSON object with an 'id' ({err})") from err
    return ids


def _plot_losses(records, losses, epsilon: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for hops in sorted({r.hops for r in records}):
        values = [loss for r, loss in zip(records, losses) if r.hops == hops]
        ax.hist(values, bins=30, alpha=0.6, label=f"{hops} hop(s)")
    ax.axvline(epsilon, color="black", linestyle="--", label=f"epsilon = {epsilon:.3f}")
    ax.set_xlabel("per-example SFT loss of the warm-up model")
    ax.set_ylabel("questions")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def register(subparsers: argparse._SubParsersAction) -> None:
    """`kgreasoner hard-cases --set model=CKPT --set trajectories=WARMUP.jsonl --set output=HARD.jsonl`."""
    from kgreasoner.config import add_config_arguments, describe

    parser = subparsers.add_parser(
        "hard-cases",
        help="score warm-up trajectories with a checkpoint and keep the hard multi-hop ones",
        description=__doc__ + "\nFields (HardCaseConfig):\n" + describe(HardCaseConfig),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_arguments(parser)
    parser.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    from accelerate import PartialState

    from kgreasoner.config import load_config

    output = mine_hard_cases(load_config(HardCaseConfig, args.config, args.overrides))
    if not PartialState().is_main_process:  # under torchrun, one report (the state mining set up)
        return 0
    summary = json.loads(output.with_suffix(".summary.json").read_text(encoding="utf-8"))
    print(f"{summary['hard']} hard of {summary['scored']} scored (epsilon {summary['epsilon']:.4f}) -> {output}")
    return 0
