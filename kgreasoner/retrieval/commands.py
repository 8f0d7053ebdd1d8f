"""`kgreasoner kg`: the stores' commands (`load | serve | stats`) and `kg embed`, which needs the encoder.

`kg embed` writes the text embeddings that searches of a KG encode to the encoder's disk cache
(see `kgreasoner.retrieval.embed`), so that a first search in a new process encodes nothing but,
at most, its question.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kgreasoner.kg import commands as kg_commands
from kgreasoner.retrieval.encoder import ENCODER_KINDS

CONTEXT_CHOICES = ("all", "first")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    commands = kg_commands.register(subparsers)
    embed = commands.add_parser(
        "embed",
        help="write the text embeddings that searches of a KG encode to the encoder's disk cache",
        description="Encode ahead every graph text a search can encode (or, with --topics, what the first search "
        "of each question's topic entities reads) and the questions, into the encoder's cache folder. "
        "Resumable: texts already cached are skipped.",
    )
    embed.add_argument(
        "input",
        help="the KG: a dataset folder, kb.tsv or memory:PATH; with --topics any KG spec "
        "(oxigraph:DIR, sparql:URL, ...)",
    )
    embed.add_argument(
        "--cache-dir",
        type=Path,
        required=True,
        help="the encoder cache folder the search tool is given (ToolConfig.encoder.cache_dir)",
    )
    embed.add_argument(
        "--ranker",
        type=Path,
        default=None,
        help="a trained ranker folder: its encoder and max_context are used, as the tool uses them",
    )
    embed.add_argument("--encoder", choices=ENCODER_KINDS, default="minilm", help="encoder kind without --ranker")
    embed.add_argument("--model-path", default=None, help="local MiniLM folder (default: the packaged one)")
    embed.add_argument("--max-length", type=int, default=64, help="token limit per text, as the tool's encoder")
    embed.add_argument("--hashing-dim", type=int, default=256, help="vector size of the hashing encoder")
    embed.add_argument("--batch-size", type=int, default=128, help="texts per forward pass")
    embed.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: as set)")
    embed.add_argument(
        "--questions",
        type=Path,
        default=None,
        help="questions.jsonl whose questions are embedded too (and whose topic entities --topics "
        "searches); default: questions.jsonl beside INPUT, if any",
    )
    embed.add_argument(
        "--topics",
        action="store_true",
        help="embed only what the first search of each question's topic entities reads, through "
        "INPUT's backend and in its edge order (for a graph too large to embed whole)",
    )
    embed.add_argument(
        "--context",
        choices=CONTEXT_CHOICES,
        default="all",
        help="whole graph: every node's edges as context texts (right for any backend's edge order), "
        "or the first max_context + 1 in the memory store's order (fewer texts; right for "
        "searches of the memory store only)",
    )
    embed.add_argument(
        "--max-context",
        type=int,
        default=None,
        help="context edges per candidate (default: the ranker's, else ToolConfig's)",
    )
    for flag, what in (
        ("--rerank-pool", "rerank_pool"),
        ("--relation-first", "relation_first"),
        ("--neighbor-limit", "neighbor_limit"),
    ):
        embed.add_argument(
            flag,
            type=_count_or_none,
            default=argparse.SUPPRESS,
            help=f"with --topics: ToolConfig.{what} of the tool that will search (a number or "
            "none; default: ToolConfig's)",
        )
    embed.add_argument(
        "--chunk", type=int, default=4096, help="texts per table written while encoding: what a killed run can lose"
    )
    embed.set_defaults(func=run_embed)


def _count_or_none(value: str) -> int | None:
    return None if value == "none" else int(value)


def run_embed(args: argparse.Namespace) -> int:
    from kgreasoner.kg.memory import MemoryKG
    from kgreasoner.kg.open import open_kg, parse_spec
    from kgreasoner.records.schema import read_jsonl
    from kgreasoner.retrieval.embed import embed_ahead, first_search_texts, kg_texts
    from kgreasoner.retrieval.encoder import EncoderConfig, EncoderFields, build_encoder
    from kgreasoner.retrieval.ranker import load_ranker
    from kgreasoner.retrieval.tool import ToolConfig

    if args.chunk < 1:
        raise ValueError(f"--chunk must be >= 1, got {args.chunk}")
    tool = ToolConfig()
    encoder_fields = EncoderFields(
        kind=args.encoder, model_path=args.model_path, max_length=args.max_length, hashing_dim=args.hashing_dim
    )
    max_context = tool.max_context
    if args.ranker is not None:
        _, meta = load_ranker(args.ranker)
        encoder_fields = meta.get("encoder") or encoder_fields
        max_context = int(meta.get("max_context", max_context))
    if args.max_context is not None:
        max_context = args.max_context
    encoder = build_encoder(
        EncoderConfig(
            **encoder_fields, batch_size=args.batch_size, cache_dir=str(args.cache_dir), num_threads=args.threads
        )
    )

    questions_file = args.questions or _questions_beside(args.input)
    examples = read_jsonl(questions_file) if questions_file else []
    if args.topics and not examples:
        raise ValueError("kg embed --topics needs questions: pass --questions FILE (a questions.jsonl)")
    kg = open_kg(args.input)
    try:
        if args.topics:
            setting = {
                name: getattr(args, name, getattr(tool, name))
                for name in ("rerank_pool", "relation_first", "neighbor_limit")
            }
            topics = dict.fromkeys((t.id, e.id) for e in examples for t in e.topic_entities)
            texts = list(
                first_search_texts(
                    kg, topics, max_context=max_context, expand_mediators=tool.expand_mediators, **setting
                )
            )
            scope = f"the first searches of {len(topics)} topic entities"
        else:
            if not isinstance(kg, MemoryKG):
                raise ValueError(
                    f"kg embed reads a whole graph from a memory store, not {parse_spec(args.input)[0]}: "
                    "give the kb.tsv or dataset folder it was loaded from, or --topics to embed the "
                    "first searches of the questions' topic entities through it"
                )
            texts = list(kg_texts(kg, None if args.context == "all" else max_context + 1))
            scope = f"{kg.num_triples} triples, {args.context} context edges"
    finally:
        kg.close()
    questions = [e.question for e in examples]
    graph_texts = len(set(texts))
    print(
        f"kg embed: {graph_texts} graph texts ({scope}) and {len(set(questions))} questions"
        f"{f' of {questions_file}' if questions_file else ''} -> {encoder.name} in {args.cache_dir}",
        flush=True,
    )
    report = embed_ahead(encoder, texts + questions, batch=args.batch_size, chunk=args.chunk)
    rate = report.encoded / report.seconds if report.seconds > 0 else 0.0
    print(
        f"kg embed: {report.encoded} texts encoded in {report.seconds:.1f} s ({rate:,.0f} texts/s), "
        f"{report.cached} already cached"
    )
    per_text = report.table_bytes / report.table_texts if report.table_texts else 0
    print(
        f"kg embed: the table holds {report.table_texts} texts, {report.table_bytes / 1e6:,.1f} MB "
        f"({per_text:,.0f} bytes a text): {report.table}"
    )
    return 0


def _questions_beside(spec: str) -> Path | None:
    """questions.jsonl in the dataset folder that a KG spec names (or that holds its file), if any."""
    from kgreasoner.kg.open import parse_spec

    scheme, target = parse_spec(spec)
    if scheme not in ("memory", "subgraph"):
        return None
    path = Path(target)
    folder = path if path.is_dir() else path.parent
    return folder / "questions.jsonl" if (folder / "questions.jsonl").is_file() else None
