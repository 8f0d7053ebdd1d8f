"""Latency of `SearchSession.call` with the GAT ranker on a large synthetic KG.

Builds (or reuses) a synthetic dataset of about `--triples` triples (hubs of thousands of
neighbours), trains a small ranker on it unless `--ranker` is given (latency does not depend on
what the ranker learned, so any ranker of the same size and encoder will do), then times the first search
of topic entities of test questions plus the biggest hubs, in fresh sessions, four times: with an
empty embedding cache (cold), with a new encoder over the on-disk cache the first pass wrote (disk:
what another process or rank sees; a new tool, so no ranking or context is cached), again (warm: the
same question and entity, as the rollouts of one GRPO group, answered by the ranking cache), and
again with the ranking cache emptied (rerank: the ranker runs, the contexts and texts are cached).
Then with embeddings made ahead (`kgreasoner kg embed --topics`, here for the searched entities): the
graph texts that the first search of each searched entity can read, whatever the question, are
embedded into an empty cache folder's table, and a new tool and encoder over it time the searches
(ahead, new question: the questions are not embedded, so each search encodes its question; ahead:
the questions embedded too, as `kg embed` does with a dataset's questions.jsonl). The embedding
rate and table size of that run, per million texts, follow the table, with the number of texts a
whole-graph `kg embed` of the memory store would write.
Backends: the embedded `memory` store, and `sparql` (an `oxigraph serve` on 127.0.0.1 over a store
built from the same triples). Time is split into KG fetches (candidates and their context), text
encoding and ranking (the network); `cached` counts searches the ranking cache answered, `texts
encoded` the texts that the encoder had to run on (found in no cache). The memory
store's load time and resident bytes per triple are printed first.

    python bench/retrieval_bench.py --work /tmp/retrieval-bench [--triples 1000000] [--backends memory,sparql]
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

import numpy as np

from data_gen.synthetic import write_synthetic
from kgreasoner.kg.base import KnowledgeGraph
from kgreasoner.kg.memory import MemoryKG
from kgreasoner.records.schema import QAExample, TopicEntity, read_jsonl
from kgreasoner.retrieval.embed import EmbedReport, embed_ahead, first_search_texts, kg_texts
from kgreasoner.retrieval.encoder import EncoderConfig, build_encoder
from kgreasoner.retrieval.ranker import RankerModelConfig, load_ranker
from kgreasoner.retrieval.ranking import Timings
from kgreasoner.retrieval.tool import KGSearchTool, ToolConfig
from kgreasoner.retrieval.training import RankerTrainConfig, train_ranker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, required=True, help="folder for the dataset, ranker, cache and store")
    parser.add_argument("--triples", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ranker", type=Path, help="a trained ranker folder (default: train one in --work)")
    parser.add_argument("--encoder", default="minilm", choices=("minilm", "hashing"))
    parser.add_argument("--calls", type=int, default=100, help="searches of test questions' topic entities")
    parser.add_argument("--hubs", type=int, default=10, help="searches of the highest-degree entities")
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--rerank-pool", type=int, default=64)
    parser.add_argument(
        "--relation-first",
        type=lambda v: None if v == "none" else int(v),
        default=256,
        help="ToolConfig.relation_first: degree above which a search ranks relation first; none: exact",
    )
    parser.add_argument("--backends", default="memory,sparql")
    args = parser.parse_args()

    data_dir = args.work / f"synthetic-{args.triples}-{args.seed}"
    if not (data_dir / "questions.jsonl").is_file():
        start = time.perf_counter()
        write_synthetic(data_dir, seed=args.seed, target_triples=args.triples)
        print(f"generated {data_dir} in {time.perf_counter() - start:.1f}s")
    before = resident_bytes()
    start = time.perf_counter()
    kg = MemoryKG.from_file(data_dir / "kb.tsv")
    print(
        f"memory store: {kg.num_triples} triples loaded in {time.perf_counter() - start:.1f}s, "
        f"{(resident_bytes() - before) / kg.num_triples:.0f} resident bytes per triple"
    )
    encoder_config = EncoderConfig(kind=args.encoder, cache_dir=str(args.work / "embedding-cache"))

    ranker_dir = args.ranker or args.work / f"ranker-{args.encoder}"
    if not (ranker_dir / "model.safetensors").is_file():
        start = time.perf_counter()
        train_ranker(
            RankerTrainConfig(
                data=str(data_dir),
                encoder=encoder_config,
                model=RankerModelConfig(),
                max_train_questions=100,
                max_eval_questions=30,
                max_group_candidates=50,
                epochs=10,
                patience=2,
                out_dir=str(ranker_dir),
                seed=args.seed,
            )
        )
        print(f"trained {ranker_dir} in {time.perf_counter() - start:.1f}s")
    model, meta = load_ranker(ranker_dir)

    queries = pick_queries(kg, read_jsonl(data_dir / "questions.jsonl"), args.calls, args.hubs)
    degrees = [kg.degree(t.id) for _, t in queries]
    print(
        f"{len(queries)} searches; degree p50 {np.median(degrees):.0f}, max {max(degrees)}, "
        f"{sum(d >= 5000 for d in degrees)} with degree >= 5000"
    )

    config = ToolConfig(
        ranking="gat",
        top_k=args.top_k,
        rerank_pool=args.rerank_pool,
        relation_first=args.relation_first,
        max_context=int(meta.get("max_context", 16)),
        encoder=encoder_config,
    )
    print(
        "| backend | cache | calls | p50 ms | p99 ms | mean ms | fetch ms | encode ms | rank ms | cached "
        "| texts encoded |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    notes = []
    # one folder for every backend: a later backend embeds only the texts its edge order adds
    ahead = tempfile.TemporaryDirectory(dir=args.work)
    for index, backend in enumerate(args.backends.split(",")):
        with (
            open_backend(backend, data_dir, args.work) as backend_kg,
            tempfile.TemporaryDirectory(dir=args.work) as cache_dir,
        ):
            # cold: an empty embedding cache; disk: a new encoder (as in another process or rank)
            # over the shards the cold pass flushed; warm: the same searches again in memory.
            encoder = build_encoder(EncoderConfig(kind=args.encoder, cache_dir=cache_dir))
            print(
                row(
                    backend,
                    "cold",
                    time_calls(KGSearchTool(backend_kg, config, ranker=model, encoder=encoder), queries),
                ),
                flush=True,
            )
            encoder.flush()
            tool = KGSearchTool(
                backend_kg,
                config,
                ranker=model,
                encoder=build_encoder(EncoderConfig(kind=args.encoder, cache_dir=cache_dir)),
            )
            for cache in ("disk", "warm", "rerank"):
                if cache == "rerank":
                    tool.scorer.forget_rankings()
                print(row(backend, cache, time_calls(tool, queries)), flush=True)
            ahead_config = dataclasses.replace(encoder_config, cache_dir=ahead.name)
            report = embed_first_searches(backend_kg, queries, config, ahead_config, questions=False)
            notes.append(f"{backend}: {embed_note(report)}")
            passes = ("ahead, new question", "ahead") if index == 0 else ("ahead",)
            for cache in passes:
                if cache == "ahead":
                    embed_first_searches(backend_kg, queries, config, ahead_config, questions=True)
                fresh = KGSearchTool(backend_kg, config, ranker=model, encoder=build_encoder(ahead_config))
                print(row(backend, cache, time_calls(fresh, queries)), flush=True)
    ahead.cleanup()
    for note in notes:
        print(f"embedded ahead, {note}")
    texts = {
        context: len(set(kg_texts(kg, None if context == "all" else config.max_context + 1)))
        for context in ("all", "first")
    }
    print(
        f"a whole-graph `kg embed` of these {kg.num_triples} triples: {texts['all']} texts "
        f"(--context first: {texts['first']})"
    )


def embed_first_searches(
    kg: KnowledgeGraph,
    queries: list[tuple[str, TopicEntity]],
    config: ToolConfig,
    encoder_config: EncoderConfig,
    questions: bool,
) -> EmbedReport:
    """`kg embed --topics` for the searched entities (and, with `questions`, the searches' questions)."""
    texts = list(
        first_search_texts(
            kg,
            dict.fromkeys((topic.id, None) for _, topic in queries),
            max_context=config.max_context,
            rerank_pool=config.rerank_pool,
            relation_first=config.relation_first,
            neighbor_limit=config.neighbor_limit,
            expand_mediators=config.expand_mediators,
        )
    )
    if questions:
        texts += [question for question, _ in queries]
    return embed_ahead(build_encoder(encoder_config), texts, batch=encoder_config.batch_size, progress=False)


def embed_note(report: EmbedReport) -> str:
    rate = report.encoded / report.seconds if report.seconds > 0 else float("nan")
    per_text = report.table_bytes / max(report.table_texts, 1)
    return (
        f"the first searches' graph texts: {report.texts} texts, {report.encoded} encoded in "
        f"{report.seconds:.1f} s "
        f"({rate:,.0f} texts/s: {1e6 / rate / 3600:.2f} h per million texts), table {report.table_texts} texts, "
        f"{per_text:,.0f} bytes a text ({per_text * 1e6 / 1e9:.2f} GB per million texts)"
    )


def pick_queries(kg: MemoryKG, examples: list[QAExample], calls: int, hubs: int) -> list[tuple[str, TopicEntity]]:
    test = [e for e in examples if e.split == "test"][:calls]
    queries = [(e.question, e.topic_entities[0]) for e in test]
    by_degree = sorted(kg.names().items(), key=lambda item: -kg.degree(item[0]))[:hubs]
    for i, (entity, label) in enumerate(by_degree):
        queries.append(
            (test[i % len(test)].question if test else f"what is related to {label}", TopicEntity(entity, label))
        )
    return queries


def time_calls(tool: KGSearchTool, queries: list[tuple[str, TopicEntity]]) -> dict:
    timings: Timings = tool.timings
    timings.reset()
    encoder = tool.scorer.encoder
    misses = encoder.misses if encoder is not None else 0
    latencies = []
    for question, topic in queries:
        session = tool.session(question, [topic])
        start = time.perf_counter()
        result = session.call(topic.name)
        latencies.append(time.perf_counter() - start)
        if result.error:
            raise RuntimeError(f"search of {topic} failed: {result.text}")
    n = len(queries)
    return {
        "calls": n,
        "p50": np.percentile(latencies, 50),
        "p99": np.percentile(latencies, 99),
        "mean": float(np.mean(latencies)),
        "fetch": timings.fetch / n,
        "encode": timings.encode / n,
        "rank": timings.rank / n,
        "cached": timings.cached,
        "encoded": (encoder.misses - misses) if encoder is not None else 0,
    }


def row(backend: str, cache: str, t: dict) -> str:
    ms = {k: 1000 * v for k, v in t.items() if k not in ("calls", "cached", "encoded")}
    return (
        f"| {backend} | {cache} | {t['calls']} | {ms['p50']:.2f} | {ms['p99']:.1f} | {ms['mean']:.2f} | "
        f"{ms['fetch']:.2f} | {ms['encode']:.2f} | {ms['rank']:.2f} | {t['cached']} | {t['encoded']} |"
    )


def resident_bytes() -> int:
    """This process's resident set size (Linux)."""
    with open("/proc/self/status") as status:
        return int(next(line for line in status if line.startswith("VmRSS")).split()[1]) * 1024


class open_backend:
    """The memory KG, or a SPARQL endpoint (oxigraph serve) over a store of the same triples."""

    def __init__(self, backend: str, data_dir: Path, work: Path) -> None:
        self.backend, self.data_dir, self.work = backend, data_dir, work
        self.server = None

    def __enter__(self) -> KnowledgeGraph:
        if self.backend == "memory":
            return MemoryKG.from_file(self.data_dir / "kb.tsv")
        if self.backend != "sparql":
            raise ValueError(f"unknown backend {self.backend!r}; use memory or sparql")
        from kgreasoner.kg.oxigraph_store import OxigraphKG
        from kgreasoner.kg.server import start_oxigraph_server
        from kgreasoner.kg.sparql import SparqlKG

        store = self.work / f"store-{self.data_dir.name}"
        if not store.is_dir():
            start = time.perf_counter()
            OxigraphKG.build(self.data_dir, store).close()
            print(f"built oxigraph store {store} in {time.perf_counter() - start:.1f}s")
        self.server = start_oxigraph_server(store)
        return SparqlKG(self.server.url)

    def __exit__(self, *exc) -> None:
        if self.server is not None:
            self.server.stop()


if __name__ == "__main__":
    main()
