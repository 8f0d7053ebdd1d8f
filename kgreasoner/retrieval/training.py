"""Training and evaluating the GAT ranker on labels made from gold paths.

`train_ranker(config)` loads a dataset and its KG, labels candidates along gold paths
(kgreasoner.retrieval.labels), encodes every distinct text once, trains with cross-entropy and early
stopping on the dev split's MRR, saves the best weights (safetensors + ranker.json) and reports
recall@k and MRR on the test split for `gat`, `embedding` (cosine of question and "relation +
entity" text, no context) and `none` (KG order).

Metrics, per group (one searched entity of one question, all its candidates):
recall@k = 1 when a gold-path candidate is among the top k; MRR = 1 / rank of the first one.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from kgreasoner.data import load_dataset, open_dataset_kg
from kgreasoner.data.path_search import with_derived_paths
from kgreasoner.kg.base import KnowledgeGraph
from kgreasoner.records.schema import QAExample
from kgreasoner.records.splits import DEFAULT_SPLIT_SCHEME, SCHEMES, SPLIT_SCHEME_HELP
from kgreasoner.retrieval.candidates import candidate_context
from kgreasoner.retrieval.encoder import (
    EncoderConfig,
    TextEncoder,
    build_encoder,
    recorded_fields,
    saved_encoder_config,
)
from kgreasoner.retrieval.labels import LabelledGroup, label_groups
from kgreasoner.retrieval.ranker import GATRanker, RankerModelConfig, load_ranker, save_ranker
from kgreasoner.retrieval.ranking import RANKING_METHODS, GroupRows, TextTable, collate, group_rows

log = logging.getLogger(__name__)


@dataclass
class RankerTrainConfig:
    """Everything `python train/ranker.py --config configs/ranker.yaml` reads."""

    data: str = field(
        default="", metadata={"help": "dataset name (PQ-3H, PQL-3H, ...) or folder (kb.tsv + questions.jsonl)"}
    )
    data_root: str | None = field(
        default=None, metadata={"help": "data root for named benchmarks; default lookup when None"}
    )
    split_scheme: str = field(default=DEFAULT_SPLIT_SCHEME, metadata={"help": SPLIT_SCHEME_HELP})
    split_seed: int = field(default=0, metadata={"help": "seed of that split"})
    encoder: EncoderConfig = field(
        default_factory=EncoderConfig, metadata={"help": "text encoder (kind minilm or hashing)"}
    )
    model: RankerModelConfig = field(
        default_factory=RankerModelConfig, metadata={"help": "ranker sizes (dim is set from the encoder)"}
    )
    negative_ratio: float = field(default=4.0, metadata={"help": "negatives sampled per positive in training groups"})
    max_frontier: int = field(default=4, metadata={"help": "entities searched per hop when labelling"})
    max_context: int = field(default=16, metadata={"help": "context edges per candidate"})
    expand_mediators: bool = field(
        default=True, metadata={"help": "candidates go through unnamed nodes, as in the tool"}
    )
    neighbor_limit: int | None = field(default=10000, metadata={"help": "edges fetched per node"})
    max_group_candidates: int | None = field(
        default=1000, metadata={"help": "candidates kept per group at hubs (positives + sampled negatives)"}
    )
    max_train_questions: int | None = field(default=None, metadata={"help": "use only the first N training questions"})
    max_eval_questions: int | None = field(
        default=None, metadata={"help": "use only the first N dev and N test questions"}
    )
    epochs: int = field(
        default=30,
        metadata={
            "help": "the training budget: passes over the training groups (fewer when early stopping ends it); "
            "a count, not a clock, so a busy machine trains the same ranker, only later"
        },
    )
    batch_groups: int = field(default=64, metadata={"help": "groups (questions x searched entity) per optimiser step"})
    lr: float = field(default=2e-3, metadata={"help": "AdamW learning rate"})
    weight_decay: float = field(default=1e-4, metadata={"help": "AdamW weight decay"})
    patience: int = field(default=3, metadata={"help": "epochs without a better dev MRR before stopping"})
    seed: int = field(default=0, metadata={"help": "seed for negatives, shuffling and initialisation"})
    eval_ks: list[int] = field(default_factory=lambda: [1, 3, 5], metadata={"help": "k of recall@k"})
    out_dir: str = field(default="checkpoints/ranker", metadata={"help": "where model.safetensors and ranker.json go"})
    torch_threads: int | None = field(default=None, metadata={"help": "torch CPU threads; None: torch's default"})

    @classmethod
    def misplaced_key(cls, key: str) -> str | None:
        """`kgreasoner.config.from_dict`'s hint for a key the config does not have."""
        if key == "scheme":
            return "scheme was renamed split_scheme (the name every stage uses)"
        if key == "max_train_seconds":
            return (
                "max_train_seconds was removed (a clock made a busy machine train a worse ranker): bound training "
                "with epochs (and patience)"
            )
        return None

    def __post_init__(self) -> None:
        if not self.data:
            raise ValueError("field 'data' is required: a dataset name (PQ-3H) or a dataset folder")
        if self.split_scheme not in SCHEMES:
            raise ValueError(f"field 'split_scheme' must be one of {SCHEMES}, got {self.split_scheme!r}")
        if self.epochs < 1 or self.batch_groups < 1 or self.patience < 1 or self.max_frontier < 1:
            raise ValueError("epochs, batch_groups, patience and max_frontier must be >= 1")
        if self.negative_ratio <= 0 or self.lr <= 0:
            raise ValueError("negative_ratio and lr must be > 0")
        if not self.eval_ks or min(self.eval_ks) < 1:
            raise ValueError("eval_ks must list k >= 1")


@dataclass
class FeaturizedGroups:
    """Groups as rows of one text table, plus labels and the rows of each candidate's full text."""

    rows: list[GroupRows]
    labels: list[np.ndarray]
    texts: list[np.ndarray]

    def __len__(self) -> int:
        return len(self.rows)


def featurize(
    table: TextTable, kg: KnowledgeGraph, groups: Sequence[LabelledGroup], max_context: int
) -> FeaturizedGroups:
    """Each candidate's context read from its question's graph (`kg.for_example`), as the tool reads it."""
    rows, labels, texts = [], [], []
    for group in groups:
        graph = kg.for_example(group.question_id)
        contexts = [candidate_context(graph, c, max_context) for c in group.candidates]
        rows.append(group_rows(table, group.question, group.candidates, contexts))
        labels.append(np.array(group.labels, dtype=np.int64))
        texts.append(np.array([table.row(c.text()) for c in group.candidates], dtype=np.int64))
    return FeaturizedGroups(rows, labels, texts)


def method_scores(
    method: str, data: FeaturizedGroups, embeddings: torch.Tensor, model: GATRanker | None = None, batch: int = 256
) -> list[np.ndarray]:
    """Per group, a score per candidate (higher is better) from one of RANKING_METHODS."""
    if method == "none":
        return [-np.arange(len(y), dtype=np.float64) for y in data.labels]
    if method == "embedding":
        return [(embeddings[t] @ embeddings[r.question]).double().numpy() for r, t in zip(data.rows, data.texts)]
    assert model is not None, "gat scores need a model"
    out: list[np.ndarray] = []
    for start in range(0, len(data), batch):
        chunk = data.rows[start : start + batch]
        scores = model.score(collate(chunk, embeddings)).double().numpy()
        offsets = np.cumsum([0] + [g.num_candidates for g in chunk])
        out.extend(scores[offsets[i] : offsets[i + 1]] for i in range(len(chunk)))
    return out


def ranking_metrics(scores: Sequence[np.ndarray], labels: Sequence[np.ndarray], ks: Sequence[int]) -> dict[str, float]:
    """recall@k (a positive in the top k) and MRR, averaged over groups; ties keep KG order."""
    hits = {k: 0.0 for k in ks}
    reciprocal = 0.0
    for score, label in zip(scores, labels):
        order = sorted(range(len(score)), key=lambda i: (-score[i], i))
        rank = next(r for r, i in enumerate(order, start=1) if label[i])
        reciprocal += 1.0 / rank
        for k in ks:
            hits[k] += rank <= k
    n = max(len(labels), 1)
    metrics = {f"recall@{k}": hits[k] / n for k in ks}
    metrics["mrr"] = reciprocal / n
    metrics["groups"] = float(len(labels))
    return metrics


def evaluate_methods(
    data: FeaturizedGroups, embeddings: torch.Tensor, model: GATRanker | None, ks: Sequence[int]
) -> dict[str, dict[str, float]]:
    methods = [m for m in RANKING_METHODS if m != "gat" or model is not None]
    return {m: ranking_metrics(method_scores(m, data, embeddings, model), data.labels, ks) for m in methods}


def format_table(results: dict[str, dict[str, float]], ks: Sequence[int], title: str = "") -> str:
    """A Markdown table: one row per method, recall@k and MRR columns."""
    head = "| method | " + " | ".join(f"R@{k}" for k in ks) + " | MRR | groups |"
    lines = ([f"{title}"] if title else []) + [head, "|" + "---|" * (len(ks) + 3)]
    for method, m in results.items():
        cells = " | ".join(f"{m[f'recall@{k}']:.3f}" for k in ks)
        lines.append(f"| {method} | {cells} | {m['mrr']:.3f} | {int(m['groups'])} |")
    return "\n".join(lines)


@dataclass
class TrainResult:
    out_dir: Path
    epochs_run: int
    best_epoch: int
    train_seconds: float
    description: str
    dev: dict[str, dict[str, float]]
    test: dict[str, dict[str, float]]


@dataclass
class _Splits:
    kg: KnowledgeGraph
    train: list[QAExample]
    dev: list[QAExample]
    test: list[QAExample]
    name: str
    split_scheme: str


def _load(config: RankerTrainConfig) -> _Splits:
    dataset = load_dataset(
        config.data, split_scheme=config.split_scheme, seed=config.split_seed, root=config.data_root
    )
    kg = open_dataset_kg(dataset)

    def cap(examples: list[QAExample], n: int | None) -> list[QAExample]:
        # Lazily, so that with a cap only the questions taken (and the ones without a path before
        # them) are searched for paths in a per-question KG.
        with_paths = (e for e in (with_derived_paths(e, kg) for e in examples) if e.gold_paths)
        return list(itertools.islice(with_paths, n))

    return _Splits(
        kg,
        cap(dataset.split("train"), config.max_train_questions),
        cap(dataset.split("dev"), config.max_eval_questions),
        cap(dataset.split("test"), config.max_eval_questions),
        dataset.name,
        dataset.split_scheme,
    )


def _label(
    config: RankerTrainConfig, kg: KnowledgeGraph, examples: Sequence[QAExample], negative_ratio: float | None
) -> list[LabelledGroup]:
    """`label_groups` with the config's settings; `negative_ratio` None keeps every candidate (evaluation)."""
    return label_groups(
        kg,
        examples,
        negative_ratio,
        seed=config.seed,
        max_frontier=config.max_frontier,
        expand_mediators=config.expand_mediators,
        neighbor_limit=config.neighbor_limit,
        max_candidates=config.max_group_candidates,
    )


def _describe(splits: _Splits, config: RankerTrainConfig) -> str:
    seed = "" if splits.split_scheme == "given" else f", seed {config.split_seed}"
    return f"{splits.name} ({splits.split_scheme} split{seed})"


def train_ranker(config: RankerTrainConfig) -> TrainResult:
    """Label, encode, train with early stopping, save, and evaluate against the baselines."""
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    torch.manual_seed(config.seed)
    splits = _load(config)
    if not splits.train or not splits.dev:
        raise ValueError(
            f"{config.data}: need training and dev questions with gold paths "
            f"(got {len(splits.train)} / {len(splits.dev)})"
        )
    encoder = build_encoder(config.encoder)
    table = TextTable()
    train = featurize(
        table, splits.kg, _label(config, splits.kg, splits.train, config.negative_ratio), config.max_context
    )
    dev = featurize(table, splits.kg, _label(config, splits.kg, splits.dev, None), config.max_context)
    test = featurize(table, splits.kg, _label(config, splits.kg, splits.test, None), config.max_context)
    start = time.perf_counter()
    embeddings = table.embed(encoder)
    encoder.flush()
    log.info(
        "encoded %d texts in %.1fs; groups train/dev/test %d/%d/%d",
        len(table.rows),
        time.perf_counter() - start,
        len(train),
        len(dev),
        len(test),
    )

    model_config = dataclasses.replace(config.model, dim=encoder.dim)
    model = GATRanker(model_config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    generator = torch.Generator().manual_seed(config.seed)
    best_mrr, best_state, best_epoch, stale, epochs_run = -1.0, copy.deepcopy(model.state_dict()), 0, 0, 0
    start = time.perf_counter()
    epochs = tqdm(range(1, config.epochs + 1), desc="ranker training", unit="epoch", disable=None)
    for epoch in epochs:
        model.train()
        order = torch.randperm(len(train), generator=generator).tolist()
        total = 0.0
        for first in range(0, len(order), config.batch_groups):
            chunk = order[first : first + config.batch_groups]
            inputs = collate([train.rows[i] for i in chunk], embeddings)
            target = torch.from_numpy(np.concatenate([train.labels[i] for i in chunk]))
            loss = F.cross_entropy(model(inputs), target)
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]  # torch's Tensor.backward has no annotations
            optimizer.step()
            total += loss.item() * len(chunk)
        epochs_run = epoch
        dev_mrr = ranking_metrics(method_scores("gat", dev, embeddings, model), dev.labels, config.eval_ks)["mrr"]
        log.info("epoch %d loss %.4f dev MRR %.4f", epoch, total / max(len(train), 1), dev_mrr)
        epochs.set_postfix(loss=f"{total / max(len(train), 1):.4f}", dev_mrr=f"{dev_mrr:.4f}")
        if dev_mrr > best_mrr:
            best_mrr, best_state, best_epoch, stale = dev_mrr, copy.deepcopy(model.state_dict()), epoch, 0
        else:
            stale += 1
        if stale >= config.patience:
            break
    epochs.close()
    train_seconds = time.perf_counter() - start
    model.load_state_dict(best_state)
    model.eval()
    dev_metrics = evaluate_methods(dev, embeddings, model, config.eval_ks)
    test_metrics = evaluate_methods(test, embeddings, model, config.eval_ks) if len(test) else {}
    out_dir = save_ranker(
        model,
        config.out_dir,
        {
            "encoder": recorded_fields(config.encoder),
            "max_context": config.max_context,
            "trained_on": {
                "data": splits.name,
                "split_scheme": splits.split_scheme,
                "split_seed": config.split_seed,
                "train_questions": len(splits.train),
                "train_groups": len(train),
            },
            "best_epoch": best_epoch,
            "train_seconds": round(train_seconds, 2),
            "dev": dev_metrics,
            "test": test_metrics,
        },
    )
    description = _describe(splits, config)
    return TrainResult(out_dir, epochs_run, best_epoch, train_seconds, description, dev_metrics, test_metrics)


def evaluate_saved(
    config: RankerTrainConfig, ranker_dir: str | Path, split: str = "test", encoder: TextEncoder | None = None
) -> tuple[str, dict[str, dict[str, float]]]:
    """gat (a saved ranker) vs embedding vs none on one split of `config.data`, with a description of the data."""
    model, meta = load_ranker(ranker_dir)
    if encoder is None:
        encoder = build_encoder(saved_encoder_config(meta.get("encoder") or {}, config.encoder.cache_dir))
    splits = _load(config)
    examples = {"train": splits.train, "dev": splits.dev, "test": splits.test}[split]
    groups = _label(config, splits.kg, examples, None)
    table = TextTable()
    data = featurize(table, splits.kg, groups, int(meta.get("max_context", config.max_context)))
    embeddings = table.embed(encoder)
    if hasattr(encoder, "flush"):
        encoder.flush()
    description = f"{_describe(splits, config)}, {split}"
    return description, evaluate_methods(data, embeddings, model, config.eval_ks)
