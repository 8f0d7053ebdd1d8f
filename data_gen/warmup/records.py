"""The whole set: records for many questions in a seeded order (`generate_records`), the summary,
the SFT sample, and `run`, which reads a dataset and writes the JSONL and summary."""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

from data_gen.augment import QuestionAugmenter
from data_gen.lookup_drill import lookup_drills
from data_gen.warmup.config import WarmupConfig
from data_gen.warmup.teacher import Teacher
from data_gen.warmup.templates import load_templates
from data_gen.warmup.walk import WarmupGenerator
from data_gen.warmup.writer import Skip, renumber_handles
from kgreasoner.data.entity_names import with_kg_names
from kgreasoner.data.path_search import with_derived_paths
from kgreasoner.protocol import format_tool_block, parse_trajectory
from kgreasoner.records.sampling import stratified_order
from kgreasoner.records.schema import QAExample
from kgreasoner.records.trajectories import WarmupRecord, write_warmup
from kgreasoner.retrieval.tool import KGSearchTool


def generate_records(
    generator: WarmupGenerator,
    examples: Sequence[QAExample],
    limit: int | None,
    progress: bool = False,
    label: str = "warm-up",
) -> tuple[list[WarmupRecord], Counter[str]]:
    """Records for up to `limit` examples (None: all), in a seeded order; skipped questions are counted by reason.

    Corrections are scheduled so that the running share stays at `correction_share`: a question
    that cannot take a detour becomes a gold record and the next one is asked again.

    Topic entities named by their id are named by the KG (`with_kg_names`). Questions of a per-question KG
    without gold paths get them derived on their own subgraph
    (`with_derived_paths`): all first where the order (stratified by hops) or paraphrase mixing
    (questions paired by path) needs them, else each when the loop reaches it.
    """
    config = generator.config
    # Topic entities the data names by id only (CWQ's Freebase mids) get the KG's names, as GRPO's and
    # evaluation's prompts give them: the records' prompts, thinking and searches then say what those say.
    examples = with_kg_names(examples, generator.kg)
    upfront = config.sample == "stratified" or config.augment.paraphrase_mixing > 0
    if upfront:
        examples = [with_derived_paths(e, generator.kg) for e in examples]
    augment = QuestionAugmenter(examples, config.augment, config.seed)
    if config.sample == "stratified":
        order = stratified_order(examples, config.seed)
    else:
        order = list(examples)
        random.Random(f"{config.seed}|order").shuffle(order)
    records: list[WarmupRecord] = []
    skipped: Counter[str] = Counter()
    corrections = made = 0
    bar = tqdm(total=limit if limit is not None else len(order), desc=label, unit="question", disable=not progress)
    for example in order:
        if limit is not None and made >= limit:
            break
        want_correction = corrections < round(config.correction_share * (made + 1))
        if not upfront:
            example = with_derived_paths(example, generator.kg)
        try:
            record = _make_augmented(generator, augment(example), example, want_correction)
        except Skip as skip:
            skipped[skip.reason] += 1
            continue
        if example.split == "train" and config.handle_numbers == "random":
            try:
                copies = [
                    renumber_handles(
                        record, random.Random(f"{config.seed}|{example.id}|handles|{copy}"), config.handle_pool
                    )
                    for copy in range(config.copies)
                ]
            except Skip as skip:
                skipped[skip.reason] += 1
                continue
        else:
            copies = [record]
        corrections += record.kind == "correction"
        made += 1
        records.extend(copies)
        if example.split == "train" and config.lookup_drills:
            for number, copy in enumerate(copies):
                rng = random.Random(f"{config.seed}|{example.id}|drill|{number}")
                records.extend(lookup_drills(copy, rng, config.lookup_drills))
        bar.update(1)
    bar.close()
    generator.stats.update(augment.stats)
    return records, skipped


def _make_augmented(
    generator: WarmupGenerator, augmented: QAExample, example: QAExample, correction: bool
) -> WarmupRecord:
    """The record of the rewritten question, else (its answer was the renamed topic, say) of the original one."""
    if augmented is example:
        return generator.make(example, correction)
    try:
        return generator.make(augmented, correction)
    except Skip:
        generator.stats["augment_fell_back"] += 1
        return generator.make(example, correction)


def summarize(
    records: Sequence[WarmupRecord],
    skipped: dict[str, Counter[str]],
    generator: WarmupGenerator,
    config: WarmupConfig,
    tokenizer: Any = None,
    seconds: float = 0.0,
) -> dict[str, Any]:
    """Counts by kind, hops and split, skips by reason, mean searches and characters (and tokens)."""
    parsed = [parse_trajectory(r.completion) for r in records]
    summary: dict[str, Any] = {
        "dataset": config.dataset,
        "split_scheme": config.split_scheme,
        "split_seed": config.split_seed,
        "seed": config.seed,
        "entity_handles": generator.tool.config.entity_handles,
        "ranking": generator.tool.config.ranking,
        "top_k": generator.tool.config.top_k,
        "answer_mode": config.answer_mode,
        "records": len(records),
        "by_kind": dict(sorted(Counter(r.kind for r in records).items())),
        "by_hops": {str(k): v for k, v in sorted(Counter(r.hops for r in records).items())},
        "by_split": dict(sorted(Counter(r.split for r in records).items())),
        "correction_share": round(
            sum(r.kind == "correction" for r in records) / max(1, sum(r.kind != "drill" for r in records)), 4
        ),
        "skipped": {split: dict(sorted(c.items())) for split, c in skipped.items()},
        "notes": dict(sorted(generator.stats.items())),
        "mean_searches": round(sum(len(p.searches) for p in parsed) / max(1, len(parsed)), 3),
        "mean_chars": round(sum(len(r.completion) for r in records) / max(1, len(records)), 1),
        "seconds": round(seconds, 2),
    }
    if generator.teacher is not None:
        summary["teacher"] = generator.teacher.stats()
    if tokenizer is not None and records:
        total = trained = 0
        for record in records:
            for segment in record.segments:
                n = len(tokenizer(segment.text, add_special_tokens=False)["input_ids"])
                total += n
                trained += n if segment.train else 0
        summary["mean_completion_tokens"] = round(total / len(records), 1)
        summary["mean_trained_tokens"] = round(trained / len(records), 1)
    return summary


def sample_records(records: Sequence[WarmupRecord], size: int) -> list[WarmupRecord]:
    """The records of the first `size` training questions (in the order made) and every dev record."""
    first: set[str] = set()
    for record in records:
        if record.split == "train" and len(first) < size:
            first.add(record.id)
    return [r for r in records if r.split != "train" or r.id in first]


def run(config: WarmupConfig) -> dict[str, Any]:
    """Load the data, generate train (and dev) records, write the JSONL and the summary; returns the summary."""
    from kgreasoner.data import load_dataset, open_dataset_kg

    started = time.perf_counter()
    dataset = load_dataset(
        config.dataset, split_scheme=config.split_scheme, seed=config.split_seed, root=config.data_root
    )
    kg = open_dataset_kg(dataset)
    teacher = Teacher(config.teacher) if config.teacher.enabled else None
    generator = WarmupGenerator(kg, KGSearchTool(kg, config.tool), config, load_templates(config.templates), teacher)
    records: list[WarmupRecord] = []
    skipped: dict[str, Counter[str]] = {}
    for split, limit in (("train", config.num_examples), ("dev", config.dev_examples)):
        if limit == 0:
            continue
        made, skipped[split] = generate_records(
            generator, dataset.split(split), limit, config.progress, f"warm-up {split}"
        )
        records.extend(made)
    write_warmup(records, config.output)
    if config.sample_output:
        write_warmup(sample_records(records, config.sample_size), config.sample_output)
    tokenizer = None
    if config.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(config.tokenizer)
    summary = summarize(records, skipped, generator, config, tokenizer, time.perf_counter() - started)
    summary["dataset_name"] = dataset.name
    summary["output"] = str(config.output)
    path = config.summary_path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


def replay_tool_blocks(record: WarmupRecord, tool: KGSearchTool) -> list[str]:
    """Re-run the record's searches in a fresh session; the tool blocks it gets, in order.

    Equal to the record's masked segments when the record was made with this tool and KG.
    """
    session = tool.session(record.question, list(record.topic_entities), example_id=record.id)
    return [
        format_tool_block(session.call(search.raw).text) for search in parse_trajectory(record.completion).searches
    ]
